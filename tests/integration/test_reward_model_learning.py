"""GRPO raises a learned reward model's score: a tiny reward model that likes completions ending
in '7' (tests/helpers/tiny_reward_model.py), named in task.rewards, configured by rewards.reward_model."""

from __future__ import annotations

import lightning as L
import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.rewards import REWARD_FUNCTIONS
from grpo_lightning.rewards.sources.reward_model import RewardModelOptions
from tests.helpers.tiny_reward_model import save_tiny_reward_model

pytestmark = pytest.mark.slow  # a whole run: 40 steps of the tiny policy


class ComponentHistory(L.Callback):
    def __init__(self):
        self.scores = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.scores.append(float(module.last_step.rollout.rewards.mean()))


def test_grpo_raises_the_reward_models_score(tmp_path):
    cfg = TrainConfig()
    cfg.task.rewards = {"reward_model": 1.0}
    cfg.task.correctness_reward = None
    cfg.rewards.reward_model.path = str(save_tiny_reward_model(tmp_path / "rm"))
    cfg.rollout.max_new_tokens = 2
    cfg.trainer.max_steps = 40
    cfg.trainer.output_dir = str(tmp_path / "run")
    cfg.logger.kind = "none"
    cfg.trainer.checkpoint_every_n_steps = 0
    run = build_run(cfg)
    history = ComponentHistory()
    run.callbacks.append(history)
    try:
        run.trainer(cfg, enable_progress_bar=False).fit(run.module, datamodule=run.datamodule)
    finally:
        REWARD_FUNCTIONS["reward_model"].bind(RewardModelOptions())
    early, late = sum(history.scores[:5]) / 5, sum(history.scores[-5:]) / 5
    assert late > early + 0.15, (early, late, history.scores)
