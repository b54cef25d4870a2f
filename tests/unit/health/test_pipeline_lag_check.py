"""The pipeline's health check: dropped stale groups and the lagged tokens' gap over a window, naming
rollout.pipeline.max_lag and the corrections; silent outside rollout.mode=pipeline."""

from __future__ import annotations

from types import SimpleNamespace

from grpo_lightning.health.pipeline_lag import PipelineLagCheck, PipelineLagConfig


def view(groups=4, dropped=0, lagged_tokens=0.0, lagged_abs=0.0, pipeline=True):
    timing = {"pipeline/lag_max": 2.0, "pipeline/dropped_groups": float(dropped)} if pipeline else {}
    mismatch = {"by_lag1_tokens": lagged_tokens / 2, "by_lag3+_tokens": lagged_tokens / 2}
    mismatch.update({"by_lag1_abs_dlogp": lagged_abs / 2, "by_lag3+_abs_dlogp": lagged_abs / 2})
    rollout = SimpleNamespace(timing=timing, num_sequences=groups * 2, group_size=2)
    return SimpleNamespace(rollout=rollout, result=SimpleNamespace(mismatch=mismatch))


def run(check, views):
    return [check.evaluate(check.measure(v), v) for v in views]


def test_dropped_groups_alert_over_the_window_and_name_max_lag():
    check = PipelineLagCheck(PipelineLagConfig(window=2, max_dropped_frac=0.2))
    (first, none), (metrics, finding) = run(check, [view(dropped=1), view(dropped=2)])
    assert none is None  # the window is not full yet
    assert (
        metrics["dropped_frac_window"] == 3 / 11 and finding is not None and "27% of the finished" in finding.evidence
    )
    causes, fix = check.diagnosis(None)
    assert "rollout.pipeline.max_lag" in fix and "off_policy_action=mask" in fix


def test_the_lagged_tokens_gap_alerts_and_names_the_corrections():
    check = PipelineLagCheck(PipelineLagConfig(window=2, max_lagged_logp_diff=0.1))
    gaps = [(100, 5), (100, 14), (100, 30)]  # (lagged tokens, their summed |delta logp|) per step
    (_, first), (quiet, second), (loud, finding) = run(check, [view(lagged_tokens=n, lagged_abs=a) for n, a in gaps])
    assert first is None and second is None and quiet["lagged_abs_logp_diff_window"] == 19 / 200
    assert loud["lagged_abs_logp_diff_window"] == 44 / 200 and "by 0.220 on mean" in finding.evidence
    assert (
        "algorithm.corrections" in check.diagnosis(None)[1] and "rollout.pipeline.max_lag" in check.diagnosis(None)[1]
    )


def test_silent_outside_pipeline_mode():
    check = PipelineLagCheck(PipelineLagConfig(window=2))
    assert all(f is None and m == {} for m, f in run(check, [view(pipeline=False, dropped=9)] * 3))


def test_f8_leaves_lagged_tokens_to_this_check_in_pipeline_mode():
    """Lagged tokens far off (lag-0 ones clean): F8 names staleness for async, stays quiet for a pipeline
    (pipeline_lag judges that gap with its own threshold, naming max_lag): one alert, not two."""
    from grpo_lightning.algorithm.mismatch import GROUPS  # noqa: PLC0415
    from grpo_lightning.health.mismatch import SUM_KEYS, MismatchCheck, MismatchCheckConfig  # noqa: PLC0415

    t = {f"{g}_{k}": 0.0 for g in GROUPS for k in SUM_KEYS}
    t.update(lag0_tokens=100.0, lag0_w=100.0, lag0_w2=100.0)  # lag 0: the trainer's log-probs exactly
    t.update(lagged_tokens=100.0, lagged_abs_dlogp=50.0, lagged_k1=-50.0, lagged_w=160.0, lagged_w2=400.0)
    t.update(lagged_neg=10.0, lagged_pos=90.0, seen_tokens=0.0, fresh_tokens=0.0)
    for pipelined in (False, True):
        check = MismatchCheck(MismatchCheckConfig())
        rollout = SimpleNamespace(timing={"pipeline/lag_max": 2.0} if pipelined else {}, weight_version=None)
        metrics, finding = check.evaluate(dict(t), SimpleNamespace(rollout=rollout))
        assert metrics["lagged_abs_logp_diff"] == 0.5
        if pipelined:
            assert finding is None
        else:
            assert finding is not None and "lagged samples" in finding.evidence and check.cause == "staleness"
            assert "algorithm.corrections=[tis_token]" in check.diagnosis(None)[1]
