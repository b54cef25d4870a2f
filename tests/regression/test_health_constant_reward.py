"""A reward function that has returned one value since the start is named within 3 rollout
batches, with its value and three completions; also when others vary, and under dynamic
sampling (no optimizer step needed)."""

from __future__ import annotations

import random

import numpy as np
import torch
from conftest import fit, make_config

import grpo_lightning.tasks.arithmetic as arithmetic
from grpo_lightning.health.constant_reward import ConstantRewardCheck, ConstantRewardCheckConfig


def never_matches(monkeypatch):
    monkeypatch.setattr(arithmetic, "_leading_int", lambda text: None)  # arithmetic_close is always 0


def test_a_reward_that_never_fires_is_named_within_three_batches(monkeypatch):
    never_matches(monkeypatch)
    run = fit(make_config(5, **{"task.rewards": {"arithmetic_close": 1.0}}))
    alerts = run.health.alerts_for("constant_reward")
    assert len(alerts) == 1
    alert = alerts[0]
    assert alert.step == 2  # the third rollout batch
    assert "reward function 'arithmetic_close' returned 0 for all" in alert.evidence
    assert "(3 rollout batches)" in alert.evidence
    assert alert.evidence.count("', '") >= 2 or alert.evidence.count(", ") >= 2  # three quoted completions
    assert "format" in alert.causes and "column" in alert.causes and "type" in alert.causes
    assert "arithmetic_close" in alert.fix


def test_one_constant_reward_among_varying_ones_is_named(monkeypatch):
    never_matches(monkeypatch)
    rewards = {"arithmetic_close": 0.5, "test_length": 0.5}
    run = fit(make_config(4, **{"task.rewards": rewards}))
    alerts = run.health.alerts_for("constant_reward")
    assert alerts and "'arithmetic_close' returned 0" in alerts[0].evidence
    assert "the others ('test_length') do vary" in alerts[0].evidence


def test_under_dynamic_sampling_the_batches_count_not_the_steps(monkeypatch):
    never_matches(monkeypatch)
    overrides = {"task.rewards": {"arithmetic_close": 1.0}, "rollout.dynamic_sampling": True}
    run = fit(make_config(4, **overrides))
    alerts = run.health.alerts_for("constant_reward")
    assert alerts and alerts[0].step == 2


def test_rewards_that_vary_raise_no_alert():
    run = fit(make_config(4, **{"task.rewards": {"test_length": 1.0}}))
    assert run.health.alerts_for("constant_reward") == []


class View:
    def __init__(self, components: dict[str, list[float]], step: int):
        self.step = step
        self.rollout = type("R", (), {})()
        self.rollout.reward_components = {k: torch.tensor(v, dtype=torch.float32) for k, v in components.items()}
        self.rollout.completions = ["a", "b", "c", "d"]


def judge(batches: list[dict[str, list[float]]], ranks: int = 1, first_step: int = 0):
    """Feed batches (each split over ``ranks`` and summed as the monitor does); the last finding."""
    check = ConstantRewardCheck(ConstantRewardCheckConfig(batches=len(batches)))
    finding = None
    for index, batch in enumerate(batches):
        views = [View({k: v[r::ranks] for k, v in batch.items()}, first_step + index) for r in range(ranks)]
        local = [check.measure(v) for v in views]
        totals = {k: sum(d[k] for d in local) for k in local[0]}
        _, finding = check.evaluate(totals, views[0])
    return finding


def test_constant_is_found_exactly_when_every_value_was_the_same():
    """Many random runs: constants of any size and sign, None (NaN) holes, split over ranks."""
    rng = random.Random(0)
    for _ in range(300):
        value = rng.choice([0.0, 1.0, -0.5, 1e6, rng.uniform(-100, 100)])
        batches = [{"f": [value] * 8, "g": [rng.random() for _ in range(8)]} for _ in range(rng.randint(1, 4))]
        for batch in batches:
            for i in rng.sample(range(8), rng.randint(0, 3)):
                batch["f"][i] = float("nan")
        differs = rng.random() < 0.5
        if differs:
            b, i = rng.randrange(len(batches)), rng.randrange(8)
            batches[b]["f"][i] = value + rng.choice([1e-3, -1.0, 0.5]) * max(1.0, abs(value))
        finding = judge(batches, ranks=rng.choice([1, 2, 4]))
        assert (finding is not None) == (not differs and not all(np.isnan(batches[0]["f"]))), (value, batches)
        if finding is not None:
            assert "'f' returned" in finding.evidence and "'g'" in finding.evidence


def test_a_resumed_run_is_not_judged():
    assert judge([{"f": [0.0] * 4}] * 3, first_step=7) is None
    assert judge([{"f": [0.0] * 4}] * 3, first_step=0) is not None
