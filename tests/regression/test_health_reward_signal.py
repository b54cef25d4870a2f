"""Reward signal: a reward that gives every sample the same value leaves every group without
signal and is reported after the window; identical samples show F1's signature in the
rewards (they vary between prompts, never within a group)."""

from __future__ import annotations

from conftest import fit, make_config

import grpo_lightning.rollout.generator as rollout_module
import grpo_lightning.tasks.arithmetic as arithmetic
from grpo_lightning.rollout.seeding import sample_seed

WINDOW = 20  # the default window


def test_constant_reward_is_reported_after_the_window(monkeypatch):
    monkeypatch.setattr(arithmetic, "_leading_int", lambda text: None)  # arithmetic_close is always 0
    run = fit(make_config(WINDOW + 2, **{"task.rewards": {"arithmetic_close": 1.0}}))
    alerts = run.health.alerts_for("reward_signal")
    assert alerts, f"no reward_signal alert; alerts: {[a.check for a in run.health.alerts]}"
    assert alerts[0].step == WINDOW - 1  # as soon as the window is full
    assert alerts[0].values["stuck_frac"] == 1.0
    assert "100% of the groups had zero reward std" in alerts[0].evidence
    assert "the reward has not varied once in this run" in alerts[0].evidence
    assert "partial-credit reward" in alerts[0].fix


def test_identical_samples_show_the_f1_signature_in_the_rewards(monkeypatch):
    # One seed per prompt, shared by the prompt's samples: groups identical, prompts differ.
    monkeypatch.setattr(
        rollout_module,
        "group_seeds",
        lambda s, r, st, p, g: [sample_seed(s, r, st, i, 0) for i in range(p) for _ in range(g)],
    )
    overrides = {"task.rewards": {"arithmetic_digits": 1.0}, "health.reward_signal.max_stuck_frac": 0.5}
    run = fit(make_config(WINDOW + 2, **overrides))  # partial credit: rewards differ between prompts
    alerts = run.health.alerts_for("reward_signal")
    assert alerts and "signature of identical samples within a group (F1)" in alerts[0].evidence
    assert run.health.alerts_for("diversity")  # the root cause is reported too


def test_healthy_twin_has_no_reward_signal_alert():
    run = fit(make_config(WINDOW + 10))
    assert run.health.alerts_for("reward_signal") == []
    assert run.health.last_metrics["health/reward_signal/stuck_frac"] < 0.9
