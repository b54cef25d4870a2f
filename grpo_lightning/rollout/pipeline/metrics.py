"""The pipeline's per-step metrics (``pipeline/*``): how stale the trained tokens are, how many versions a
sequence spans, and where the step's wall time went (engine busy or idle, trainer busy or waiting)."""

from __future__ import annotations

from grpo_lightning.records import Completion
from grpo_lightning.rollout.pipeline.engine import ClockReading

PREFIX = "pipeline/"


def version_metrics(completions: list[Completion], now: int) -> dict[str, float]:
    """Lag (``now`` minus the version that sampled each trained token) and versions per sequence."""
    lags, spans = [], []
    for c in completions:
        versions = c.versions() or []
        mask = c.loss_mask or [1] * len(versions)
        sampled = [v for v, m in zip(versions, mask, strict=True) if m and v >= 0]
        lags += [now - v for v in sampled]
        spans.append(len(set(sampled)))
    n = max(len(spans), 1)
    return {
        PREFIX + "lag_mean": sum(lags) / len(lags) if lags else 0.0,
        PREFIX + "lag_max": float(max(lags, default=0)),
        PREFIX + "versions_per_sequence": sum(spans) / n,
        PREFIX + "multi_version_seqs": sum(s > 1 for s in spans) / n,
    }


def time_metrics(cycle: float, wait: float, engine: ClockReading) -> dict[str, float]:
    """Where the cycle (from the end of the previous batch's collection to the end of this one's) went."""
    engine_total = max(engine.total, 1e-9)
    return {
        PREFIX + "cycle_seconds": cycle,
        PREFIX + "trainer_wait_seconds": wait,
        PREFIX + "trainer_busy_seconds": cycle - wait,
        PREFIX + "trainer_wait_fraction": wait / max(cycle, 1e-9),
        PREFIX + "engine_busy_seconds": engine.busy,
        PREFIX + "engine_idle_seconds": engine.idle,
        PREFIX + "engine_sync_seconds": engine.sync,
        PREFIX + "engine_idle_fraction": (engine.idle + engine.sync) / engine_total,
    }
