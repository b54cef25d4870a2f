"""F8: a rollout engine that lies is named within one step; honest engines (float32, bf16) raise nothing.

Each fault is a switch of the fake engine in tests/helpers/lying_engines.py. The learning rate is
high so that one optimizer step moves the tiny policy well beyond precision noise.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_config

from grpo_lightning.build import build_run
from grpo_lightning.models import load_policy
from tests.helpers.lying_engines import OwnWeightsEngine


def _fit(steps: int = 3, lora: bool = False, config: dict | None = None, **engine_options):
    overrides = {
        "rollout.engine": "vllm",  # an engine with weights of its own: the one passed below
        "rollout.prompts_per_step": 3,
        "rollout.num_generations": 4,
        "rollout.max_new_tokens": 6,
        "algorithm.lr": 1e-2,
        "algorithm.beta": 0.0,
        "task.rewards": {"test_length": 1.0},
        "task.max_operand": 2,  # 7 training prompts: the third step sees some prompts again
    }
    cfg = make_config(steps, **{**overrides, **(config or {})})
    if lora:
        cfg.model.lora.rank = 4
    base, tokenizer = load_policy(make_config(steps).model)  # without the adapters: what a LoRA liar serves
    run = build_run(cfg, engine=OwnWeightsEngine(base, tokenizer.eos_token_id, **engine_options))
    trainer = run.trainer(cfg, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(run.module, datamodule=run.datamodule)
    return run


def _first_alert(run):
    alerts = run.health.alerts_for("mismatch")
    assert alerts, f"no mismatch alert; metrics: {run.health.last_metrics}"
    return alerts[0]


@pytest.mark.parametrize(
    ("options", "cause", "first_faulty_step"),
    [
        ({"ignore_loads": True}, "stale_weights", 1),  # the first step after the first real sync
        ({"force_top_p": 0.8}, "truncated_support", 0),
        ({"stale_prefix_cache": True}, "prefix_cache", 2),  # the first step a cached prompt comes back
        ({"raw_logprobs": True, "config": {"rollout.temperature": 0.5}}, "temperature", 0),
    ],
)
def test_each_lying_engine_is_named_within_one_step(options, cause, first_faulty_step):
    run = _fit(**options)
    alert = _first_alert(run)
    assert alert.failure == "F8" and alert.step == first_faulty_step
    assert alert.values[f"cause/{cause}"] == 1.0, alert.evidence
    assert cause.replace("_", " ") in alert.evidence


def test_a_lora_adapter_never_loaded_is_named_stale_weights():
    alert = _first_alert(_fit(lora=True, ignore_loads=True))
    assert alert.step == 1 and alert.values["cause/stale_weights"] == 1.0
    assert "LoRA adapter" in alert.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_honest_engines_raise_nothing(dtype):
    run = _fit(dtype=dtype)
    assert run.health.alerts_for("mismatch") == []
    metrics = run.module.last_metrics
    assert metrics["mismatch/abs_logp_diff_mean"] < 0.02 and metrics["mismatch/version_lag_max"] == 0
