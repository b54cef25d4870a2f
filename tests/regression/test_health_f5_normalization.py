"""F5: a global-token normalizer applied to the policy term only is caught, whether the module
records it (mode mismatch) or hides it (the ratio-1 identity); every mode's twin is clean."""

from __future__ import annotations

import pytest
from conftest import fit, make_config

import grpo_lightning.algorithm.objective as objective_lib
from grpo_lightning.algorithm import LOSS_AGG_MODES, AggregationRecord, aggregate


def _token_mean_policy(monkeypatch, record_honestly: bool):
    """The policy term averaged over all tokens of the batch, (l*m).sum() / m.sum(); KL as configured."""
    original = objective_lib.aggregate_term

    def faulty(term, per_token, token_mask, prepared, cfg):
        if term != "policy":
            return original(term, per_token, token_mask, prepared, cfg)
        tokens = sum(mb.completion_mask.float().sum() for mb in prepared.micro_batches)  # one rank
        used = "token_mean" if record_honestly else cfg.loss_agg
        return aggregate(per_token, token_mask, "token_mean", tokens), AggregationRecord(used, tokens)

    monkeypatch.setattr(objective_lib, "aggregate_term", faulty)


def test_policy_term_with_another_normalizer_is_diagnosed_as_f5(monkeypatch):
    _token_mean_policy(monkeypatch, record_honestly=True)
    run = fit(make_config(3))
    alerts = run.health.alerts_for("normalization")
    assert alerts, f"no normalization alert; alerts: {[a.check for a in run.health.alerts]}"
    alert = alerts[0]
    assert alert.failure == "F5" and alert.step == 0
    assert "policy: token_mean" in alert.evidence and "kl: seq_mean_token_mean / 128" in alert.evidence
    assert "algorithm.loss_agg" in alert.fix


def test_hidden_normalizer_change_is_caught_by_the_ratio_one_identity(monkeypatch):
    """The fault records the configured mode, so only the numbers can tell (beta = 0: the F5 report)."""
    _token_mean_policy(monkeypatch, record_honestly=False)
    run = fit(make_config(3, **{"algorithm.beta": 0.0}))
    alerts = run.health.alerts_for("normalization")
    assert alerts and alerts[0].step == 0
    values = alerts[0].values
    assert values["mismatched"] == 0  # the records look fine ...
    assert abs(values["numerator"] / values["normalizer"]) < 1e-6  # ... seq_mean_token_mean of -A is 0 ...
    assert abs(values["reported"]) > 1e-3  # ... but the policy term was not
    assert "with ratio 1 the policy term must equal" in alerts[0].evidence


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_healthy_twin_has_no_normalization_alert(mode):
    run = fit(make_config(3, **{"algorithm.loss_agg": mode}))
    assert run.health.alerts_for("normalization") == []
    check = next(c for c in run.health.checks if c.name == "normalization")
    assert check.announced is not None and mode in check.announced  # logged once
    assert run.health.last_metrics["health/normalization/policy_term_error"] < 1e-5
    records = run.module.last_step.passes[0].aggregation
    assert {r.mode for r in records.values()} == {mode} and set(records) == {"policy", "kl"}
