"""Training on the default task with rollout.engine=vllm raises the reward like the HF engine."""

from __future__ import annotations

import statistics

import lightning as L
import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig

STEPS = 160
WINDOW = 40


class RewardLog(L.Callback):
    def __init__(self):
        self.rewards = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rewards.append(float(pl_module.last_step.rollout.rewards.mean()))


def train_default_task(engine_kind: str, engine=None) -> list[float]:
    """The default config (grpo_lightning/conf defaults: tiny model, sums, GRPO), STEPS steps, seed 0."""
    cfg = TrainConfig()
    cfg.logger.kind = "none"
    cfg.trainer.max_steps = STEPS
    # output_dir stays the default ./outputs: each test runs in its own folder (tests/conftest.py)
    cfg.rollout.engine = engine_kind
    run = build_run(cfg, engine=engine)
    log = RewardLog()
    trainer = run.trainer(cfg, callbacks=run.callbacks + [log], enable_progress_bar=False)
    trainer.fit(run.module, datamodule=run.datamodule)
    return log.rewards


@pytest.mark.slow
def test_vllm_training_raises_the_reward_like_hf(vllm_session, default_task_run):
    vllm = train_default_task("vllm", engine=vllm_session.engine)
    hf = default_task_run[1][:STEPS]  # the session's HF run (constant learning rate: its first STEPS steps)
    gains = {}
    for name, rewards in (("vllm", vllm), ("hf", hf)):
        assert len(rewards) == STEPS
        early, late = statistics.mean(rewards[:WINDOW]), statistics.mean(rewards[-WINDOW:])
        gains[name] = late - early
    # Measured: both climb from ~0.03 to ~0.25 in 160 steps (0.44 after 500).
    assert gains["hf"] > 0.1, gains
    assert gains["vllm"] > 0.1, gains
    assert gains["vllm"] > 0.6 * gains["hf"], gains
