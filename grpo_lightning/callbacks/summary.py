"""``TrainingSummary``: at the end of fit, say in one line what the run achieved."""

from __future__ import annotations

import time
from itertools import pairwise

import lightning as L
from lightning.pytorch.utilities import rank_zero_info


class TrainingSummary(L.Callback):
    """Records the mean reward of every generation batch; prints the curve when fit ends."""

    def __init__(self, window: int = 50):
        self.window = window
        self.rewards: list[float] = []
        self._start = 0.0
        self.wall_seconds = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        value = trainer.callback_metrics.get("reward/mean")
        if value is not None:
            self.rewards.append(float(value))

    def curve(self, points: int = 10) -> list[float]:
        """The reward averaged over ``points`` equal spans of the run."""
        n = len(self.rewards)
        if n == 0:
            return []
        bounds = [round(i * n / points) for i in range(points + 1)]
        return [sum(self.rewards[a:b]) / (b - a) for a, b in pairwise(bounds) if b > a]

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.wall_seconds = time.perf_counter() - self._start
        if not self.rewards:
            return
        k = min(self.window, len(self.rewards))
        first, last = sum(self.rewards[:k]) / k, sum(self.rewards[-k:]) / k
        rank_zero_info(
            f"reward/mean: {first:.3f} over the first {k} steps -> {last:.3f} over the last {k} "
            f"({len(self.rewards)} steps, {self.wall_seconds:.0f} s). Curve: "
            + " ".join(f"{v:.2f}" for v in self.curve())
        )
