"""The health metrics reach the run's logger (CSV here; wandb takes the same call), one
``health/alert/<check>`` column per check, and ``ignore`` removes a check entirely."""

from __future__ import annotations

import csv

from grpo_lightning.config import HEALTH_CHECKS

from conftest import fit, make_config


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
