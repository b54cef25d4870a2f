"""A whole async run of task=guess_number on the tiny model with a slow engine (each weight sync lands six
generate calls, about two steps of turns, late) under rollout.max_off_policy_steps=1: episodes are played
a step ahead, every trained token's version is stamped and within the bound, and what lags further is
dropped and counted."""

from __future__ import annotations

import warnings

import lightning as L
import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.models import load_policy
from grpo_lightning.tasks.guess_number import GuessNumberTaskConfig
from tests.helpers.lying_engines import OwnWeightsEngine

pytestmark = pytest.mark.slow  # a few seconds: a whole (short) run


class Trained(L.Callback):
    def __init__(self):
        self.rows: list[tuple[dict, object]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append((dict(pl_module.last_step.metrics), pl_module.last_step.rollout))


def test_async_episodes_carry_versions_and_never_train_beyond_the_bound(tmp_path):
    cfg = TrainConfig()
    cfg.task = GuessNumberTaskConfig(correctness_reward=None, max_turns=3)
    cfg.logger.kind, cfg.trainer.output_dir, cfg.trainer.max_steps = "none", str(tmp_path), 5
    cfg.rollout.engine, cfg.rollout.mode, cfg.rollout.max_staleness = "vllm", "async", 1
    cfg.rollout.max_off_policy_steps, cfg.rollout.num_generations, cfg.rollout.prompts_per_step = 1, 4, 2
    cfg.rollout.max_new_tokens = 3
    policy, tokenizer = load_policy(cfg.model)
    run = build_run(cfg, engine=OwnWeightsEngine(policy, tokenizer.eos_token_id, version_delay=6))
    trained = Trained()
    trainer = run.trainer(cfg, callbacks=run.callbacks + [trained], enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(run.module, datamodule=run.datamodule)
    assert len(trained.rows) == 5 and trainer.global_step >= 2  # steps within the bound still train
    for metrics, rollout in trained.rows:
        assert metrics["rollout/episodes/count"] == rollout.num_sequences
        on = rollout.loss_mask.bool()
        assert bool((rollout.token_weight_versions[on] >= 0).all())  # every sampled token is stamped
        assert bool((rollout.token_weight_versions[~on & rollout.completion_mask.bool()] <= rollout.step).all())
        assert metrics.get("mismatch/version_lag_max", 0) <= 1  # what was trained on
    assert max(m["rollout/staleness_max"] for m, _ in trained.rows) > 1  # the engine did fall behind
    assert sum(m["rollout/off_policy_dropped"] for m, _ in trained.rows) > 0
