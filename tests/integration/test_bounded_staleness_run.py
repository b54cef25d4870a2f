"""A whole async run with a slow engine (it applies each weight sync three generate calls late) under
rollout.max_off_policy_steps=1: the samples beyond the bound are dropped and counted, no trained
token lags more than the bound, and the run trains to the end."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
from conftest import make_config

from grpo_lightning.build import build_run
from grpo_lightning.models import load_policy
from tests.helpers.lying_engines import OwnWeightsEngine


class StepMetrics(L.Callback):
    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append(dict(pl_module.last_step.metrics))


@pytest.mark.parametrize("action", ["drop", "mask"])
def test_a_slow_engine_never_trains_beyond_the_bound(action):
    cfg = make_config(
        5,
        **{
            "rollout.engine": "vllm",
            "rollout.mode": "async",
            "rollout.max_staleness": 1,
            "rollout.max_off_policy_steps": 1,
            "rollout.off_policy_action": action,
            "rollout.prompts_per_step": 2,
            "rollout.num_generations": 4,
            "rollout.max_new_tokens": 4,
            "task.rewards": {"test_length": 1.0},
        },
    )
    policy, tokenizer = load_policy(cfg.model)
    run = build_run(cfg, engine=OwnWeightsEngine(policy, tokenizer.eos_token_id, version_delay=3))
    metrics = StepMetrics()
    trainer = run.trainer(cfg, callbacks=run.callbacks + [metrics], enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(run.module, datamodule=run.datamodule)
    assert len(metrics.rows) == 5 and trainer.global_step >= 2  # steps within the bound still train
    removed = "rollout/off_policy_dropped" if action == "drop" else "rollout/off_policy_masked_tokens"
    assert sum(r[removed] for r in metrics.rows) > 0
    assert max(r["rollout/staleness_max"] for r in metrics.rows) > 1  # the engine did fall behind
    assert all(r.get("mismatch/version_lag_max", 0) <= 1 for r in metrics.rows)  # what was trained on
