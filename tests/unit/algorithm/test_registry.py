"""The objective as registered units: every registered policy loss accumulates gradients
exactly in every aggregation mode, a new loss is one decorated function selected by name,
validation lists the registry, and the F5 check trusts each loss's own declaration."""

from __future__ import annotations

import pytest
import torch
from conftest import fit, gradients, make_config

from grpo_lightning.algorithm import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    PolicyLossInputs,
    clipped_surrogate,
    compute_advantages,
    group_advantages,
    register_advantage_estimator,
    register_policy_loss,
)
from grpo_lightning.config import AlgorithmConfig, ConfigError, TrainConfig, validate_config


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("loss", POLICY_LOSSES.names)
def test_every_registered_loss_accumulates_exactly(policy, rollout, loss, mode):
    """F4 for every loss a researcher can select: 1 micro-batch of 16 == 16 of 1 (KL on,
    two iterations so the second pass has a ratio that is not 1)."""
    settings = dict(policy_loss=loss, loss_agg=mode, beta=0.1, num_iterations=2)
    whole, whole_stats = gradients(policy, rollout, micro_batch_size=16, **settings)
    split, split_stats = gradients(policy, rollout, micro_batch_size=1, **settings)
    assert whole.keys() == split.keys() and len(whole) > 0
    for name in whole:
        scale = whole[name].abs().max().clamp(min=1e-8)
        assert (whole[name] - split[name]).abs().max() / scale < 1e-5, name
    assert split_stats.loss == pytest.approx(whole_stats.loss, abs=1e-6)


@pytest.fixture
def doubled_loss():
    """A test-only policy loss, twice GRPO's: registered by one decorated function, removed after."""
    names = []

    def register(name: str, ratio_one_identity: bool):
        @register_policy_loss(name, ratio_one_identity=ratio_one_identity)
        def doubled(inputs: PolicyLossInputs, cfg):
            out = clipped_surrogate(inputs.logp, inputs.old_logp, inputs.advantages, cfg.clip_low, cfg.clip_high)
            return out._replace(loss=2.0 * out.loss)

        names.append(name)
        return name

    yield register
    for name in names:
        POLICY_LOSSES.entries.pop(name)


def test_a_new_loss_is_one_function_selected_by_name(policy, rollout, doubled_loss):
    name = doubled_loss("test_doubled", ratio_one_identity=False)
    base, _ = gradients(policy, rollout, micro_batch_size=16, loss_agg="token_mean", beta=0.0)
    doubled, _ = gradients(policy, rollout, micro_batch_size=16, loss_agg="token_mean", beta=0.0, policy_loss=name)
    for key in base:
        assert torch.allclose(doubled[key], 2 * base[key], rtol=1e-5, atol=1e-8), key
    cfg = TrainConfig()
    cfg.algorithm.policy_loss = name
    validate_config(cfg)  # accepted: the allowed values come from the registry


def test_validation_lists_the_registered_variants():
    cfg = TrainConfig()
    cfg.algorithm.policy_loss = "ppo2"
    cfg.algorithm.advantage_estimator = "vtrace"
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    message = str(err.value)
    assert "algorithm.policy_loss='ppo2' is not a registered policy loss" in message
    assert f"Registered: {sorted(POLICY_LOSSES.names)}" in message
    assert "algorithm.advantage_estimator='vtrace' is not a registered advantage estimator" in message
    assert f"Registered: {sorted(ADVANTAGE_ESTIMATORS.names)}" in message


def test_grpo_is_the_default_and_matches_the_plain_math(rollout):
    cfg = AlgorithmConfig()
    assert cfg.policy_loss == "grpo" and cfg.advantage_estimator == "grpo"
    assert POLICY_LOSSES["grpo"].ratio_one_identity
    expected = group_advantages(rollout.rewards, rollout.group_size, cfg.advantage_scale, cfg.advantage_eps)
    assert torch.equal(compute_advantages(rollout.rewards, rollout.group_size, cfg), expected)


def test_a_new_advantage_estimator_is_one_function(rollout):
    @register_advantage_estimator("test_centered_twice")
    def twice(rewards, group_size, cfg):
        return 2 * group_advantages(rewards, group_size, "none")

    try:
        cfg = AlgorithmConfig(advantage_estimator="test_centered_twice")
        got = compute_advantages(rollout.rewards, rollout.group_size, cfg)
        assert torch.allclose(got, 2 * group_advantages(rollout.rewards, rollout.group_size, "none"))
    finally:
        ADVANTAGE_ESTIMATORS.entries.pop("test_centered_twice")


@pytest.mark.parametrize("declares_identity", [True, False])
def test_the_f5_check_reads_each_losses_declaration(doubled_loss, declares_identity):
    """Twice GRPO's loss breaks 'policy term == aggregate(-A) at ratio 1' (token_mean, where that
    value is not 0): flagged when the loss declares the identity, not checked when it does not."""
    name = doubled_loss(f"test_doubled_{declares_identity}", ratio_one_identity=declares_identity)
    run = fit(
        make_config(2, **{"algorithm.policy_loss": name, "algorithm.loss_agg": "token_mean", "algorithm.beta": 0.0})
    )
    alerts = run.health.alerts_for("normalization")
    if declares_identity:
        assert alerts and "with ratio 1 the policy term must equal" in alerts[0].evidence
    else:
        assert alerts == []
        assert "health/normalization/policy_term_error" not in run.health.last_metrics
