"""No false alarms: the default task trained for 250 steps (the session's shared run) with every
check at its default raises no alert; and the 'raise' action stops training with the diagnosis."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_RUN_STEPS, fit, make_config

import grpo_lightning.rollout.generator as rollout_module
from grpo_lightning.health import HealthCheckError


def test_default_task_trains_without_a_single_alert(default_task_run):
    run, _ = default_task_run
    assert run.health.steps == DEFAULT_RUN_STEPS
    assert [a.text for a in run.health.alerts] == []
    metrics = run.health.last_metrics
    assert all(metrics[f"health/alert/{c.name}"] == 0.0 for c in run.health.checks)
    assert metrics["health/no_update/update_norm"] > 0
    assert metrics["health/nonfinite/seqs"] == 0
    # the run is really learning, so the silence is not from a dead run
    assert run.fitted.callback_metrics["reward/mean"] > 0.15


def test_raise_action_stops_training_with_the_diagnosis(monkeypatch):
    monkeypatch.setattr(rollout_module, "group_seeds", lambda s, r, st, p, g: [7] * (p * g))
    cfg = make_config(30, **{"health.diversity.action": "raise"})
    with pytest.raises(HealthCheckError) as caught:
        fit(cfg)
    assert caught.value.alert.check == "diversity"
    assert "F1 identical completions" in str(caught.value)
    assert caught.value.alert.step < 5  # stopped early, not after 30 steps
