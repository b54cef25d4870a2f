"""``RunProgress``: one progress bar per run, with what a user watches: reward, KL, held-out
accuracy, and the time left.

Lightning's default bar shows ``v_num`` and opens a second bar for every held-out evaluation;
here evaluations run without a bar of their own and their accuracy joins the training bar.
"""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, convert_inf

# (metric, short name on the bar); val/accuracy comes from the last evaluation.
SHOWN = (("reward/mean", "reward"), ("kl/mean", "kl"), ("val/accuracy", "acc"))


class RunProgress(TQDMProgressBar):
    # tqdm's "[elapsed<remaining, rate]" is the time left (ETA); the postfix holds the metrics.
    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"

    def init_validation_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def init_sanity_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    @property
    def train_description(self) -> str:
        return "train"

    def on_train_epoch_start(self, trainer: L.Trainer, *args) -> None:
        # Lightning's own names the bar "Epoch N" here, and each refresh of a bar not on a terminal
        # is a line of its own: a run is counted in steps, so the bar keeps "train" from the start.
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset(total=convert_inf(self.total_train_batches))
        self.train_progress_bar.initial = 0

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, str]:
        step = getattr(pl_module, "last_metrics", {}) or {}
        shown = {}
        for key, name in SHOWN:
            value = step.get(key, trainer.callback_metrics.get(key))
            if value is not None and math.isfinite(float(value)):
                shown[name] = f"{float(value):.3g}"
        return shown
