"""The episode health checks: failures and limit cuts over a window, silent without episodes."""

from __future__ import annotations

from types import SimpleNamespace

from grpo_lightning.environments.limits import STOP_REASONS
from grpo_lightning.environments.rollout import METRICS
from grpo_lightning.health.episode_failures import EpisodeFailuresCheck, EpisodeFailuresConfig
from grpo_lightning.health.episode_limits import EpisodeLimitsCheck, EpisodeLimitsConfig


def view(**stops: int):
    timing = {METRICS + "count": float(sum(stops.values()))}
    timing.update({f"{METRICS}stop/{reason}": float(stops.get(reason, 0)) for reason in STOP_REASONS})
    return SimpleNamespace(rollout=SimpleNamespace(timing=timing))


def run(check, views):
    results = []
    for v in views:
        results.append(check.evaluate(check.measure(v), v))
    return results


def test_failures_alert_over_the_window_naming_the_dominant_failure():
    check = EpisodeFailuresCheck(EpisodeFailuresConfig(window=2, max_failed_frac=0.2))
    quiet, loud = run(check, [view(done=7, step_timeout=1), view(done=5, step_timeout=2, env_error=1)])
    assert quiet[1] is None and quiet[0]["failed_frac"] == 1 / 8  # the window is not full yet
    assert loud[1] is not None and "by step_timeout" in loud[1].evidence and loud[0]["failed_frac_window"] == 0.25
    check = EpisodeFailuresCheck(EpisodeFailuresConfig(window=2, max_failed_frac=0.2))
    assert all(finding is None for _, finding in run(check, [view(done=8), view(done=7, env_error=1)]))


def test_limits_alert_names_the_limit_and_its_fix():
    check = EpisodeLimitsCheck(EpisodeLimitsConfig(window=2, max_cut_frac=0.5))
    _, (metrics, finding) = run(check, [view(max_turns=3, done=1), view(max_turns=2, context=1, done=1)])
    assert finding is not None and "most by max_turns" in finding.evidence
    assert metrics["max_turns_frac"] == 0.5 and metrics["context_frac"] == 0.25
    assert "task.max_turns" in check.diagnosis(None)[1]


def test_single_turn_batches_are_ignored():
    plain = SimpleNamespace(rollout=SimpleNamespace(timing={"rollout/seconds": 1.0}))
    for check in (EpisodeFailuresCheck(EpisodeFailuresConfig(window=2)), EpisodeLimitsCheck(EpisodeLimitsConfig())):
        assert run(check, [plain, plain, plain]) == [({}, None)] * 3
