"""The health metrics reach the run's logger (CSV here; wandb takes the same call), one
``health/alert/<check>`` column per check, and ``ignore`` removes a check entirely."""

from __future__ import annotations

import csv

import pytest
from conftest import fit, make_config

from grpo_lightning.config import HEALTH_CHECKS
from grpo_lightning.step.module import CALLBACK_METRICS


def test_health_metrics_are_written_by_the_logger(tmp_path):
    cfg = make_config(3, **{"logger.kind": "csv", "trainer.output_dir": str(tmp_path)})
    run = fit(cfg)
    files = list(tmp_path.rglob("metrics.csv"))
    assert len(files) == 1
    rows = list(csv.DictReader(files[0].open()))
    columns = set(rows[0])
    assert {f"health/alert/{name}" for name in HEALTH_CHECKS} <= columns
    assert "health/diversity/distinct_per_group" in columns
    values = [float(r["health/no_update/update_norm"]) for r in rows if r.get("health/no_update/update_norm")]
    assert len(values) == 3 and all(v > 0 for v in values)
    assert run.health.alerts == []


def test_ignored_check_does_not_run():
    run = fit(make_config(2, **{"health.diversity.action": "ignore"}))
    assert "diversity" not in {c.name for c in run.health.checks}
    assert not any(key.startswith("health/diversity/") for key in run.health.last_metrics)


def test_step_metrics_reach_the_logger_every_n_steps_and_the_monitored_ones_reach_callbacks(tmp_path):
    """The module writes its step metrics to the loggers itself (one row per logged step, every
    trainer.log_every_n_steps), and gives Lightning's callback metrics the monitored ones."""
    cfg = make_config(4, **{"logger.kind": "csv", "trainer.output_dir": str(tmp_path), "trainer.log_every_n_steps": 2})
    run = fit(cfg)
    (file,) = tmp_path.rglob("metrics.csv")
    rows = [r for r in csv.DictReader(file.open()) if r.get("reward/mean")]
    assert [int(r["step"]) for r in rows] == [2, 4]
    last = run.module.last_metrics
    assert {"train/grad_norm", "policy/entropy", "completions/mean_length", "rollout/tokens_per_s"} <= set(last)
    assert all(rows[-1][key] != "" for key in last)
    assert float(rows[-1]["reward/mean"]) == pytest.approx(last["reward/mean"])
    callback = run.fitted.callback_metrics
    assert set(CALLBACK_METRICS) <= set(callback)
    assert all(float(callback[key]) == pytest.approx(last[key]) for key in CALLBACK_METRICS)
    assert {"reward/mean", "kl/mean"} <= set(run.fitted.progress_bar_metrics)
