"""End to end: Trainer.fit on the default task raises the mean reward by a clear margin."""

from __future__ import annotations

import lightning as L
import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig

pytestmark = pytest.mark.slow


class RewardHistory(L.Callback):
    def __init__(self):
        self.rewards = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rewards.append(float(module.last_step.rollout.rewards.mean()))


def test_default_task_reward_rises(tmp_path):
    cfg = TrainConfig()
    cfg.trainer.max_steps = 500
    cfg.trainer.output_dir = str(tmp_path)
    cfg.logger.kind = "none"
    run = build_run(cfg)
    history = RewardHistory()
    run.callbacks.append(history)
    run.trainer(cfg, enable_progress_bar=False).fit(run.module, datamodule=run.datamodule)
    first, last = history.rewards[:25], history.rewards[-50:]
    early, late = sum(first) / len(first), sum(last) / len(last)
    assert len(history.rewards) == 500
    assert early < 0.2, early
    assert late - early > 0.2, (early, late)
    assert run.module.counters.skipped_steps == 0
