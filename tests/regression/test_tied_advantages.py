"""Tied reward groups get advantage exactly 0, whatever the float (the tied-group bug).

The float32 mean of eight 0.7s is one ulp off, so the centered rewards were tiny but not
zero and dividing by ``std + eps`` blew them up: 0.7 gave A = 0.056 for every sample, 1000.1
gave -0.92. Hand-picked cases passed, so these are properties over many random cases:
constant groups of arbitrary floats, weighted sums of reward functions added in different
orders, groups equal but one, group sizes 2..16, every scale.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import fit, make_config

from grpo_lightning.algorithm import (
    ADVANTAGE_SCALES,
    TIE_ATOL,
    TIE_RTOL,
    group_advantages,
    rewards_equal,
    tied_groups,
)
from grpo_lightning.rewards import RewardScorer, WeightedReward, register_reward

CASES = 400  # random cases per property and scale
REPORTED = [0.1, 0.7, 1 / 3, 1000.1, 1e6 + 0.5, -0.7, -1000.1, 2.0 / 3.0, 0.0, 1e-3, 123456.789]


def random_reward(rng: random.Random) -> float:
    """A float of any sign and magnitude from 1e-4 to 1e6, or one of the reported values."""
    if rng.random() < 0.2:
        return rng.choice(REPORTED)
    return rng.choice([-1, 1]) * 10 ** rng.uniform(-4, 6)


def weighted_sum_in_some_order(rng: random.Random, scores: list[float], weights: list[float]) -> torch.Tensor:
    """sum_k w_k x s_k in float32, the terms added in a random order (as reward functions are)."""
    order = list(range(len(scores)))
    rng.shuffle(order)
    total = torch.zeros((), dtype=torch.float32)
    for k in order:
        total = total + torch.tensor(weights[k], dtype=torch.float32) * torch.tensor(scores[k], dtype=torch.float32)
    return total


def assert_healthy(adv: torch.Tensor, rewards: torch.Tensor, group_size: int) -> None:
    """Finite everywhere, float32, and summing to zero within every group."""
    assert adv.dtype == torch.float32 and adv.shape == rewards.shape
    assert torch.isfinite(adv).all(), (rewards, adv)
    grouped = adv.view(-1, group_size).double()
    scale = grouped.abs().sum(dim=1).clamp(min=1.0)
    assert (grouped.sum(dim=1).abs() / scale < 1e-5).all(), (rewards, adv)


@pytest.mark.parametrize("value", REPORTED)
@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_the_reported_constant_groups_give_exactly_zero(value, scale):
    rewards = torch.full((8,), value)
    assert torch.equal(group_advantages(rewards, 8, scale), torch.zeros(8))
    assert bool(tied_groups(rewards, 8).all())


@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_constant_groups_of_arbitrary_floats_give_exactly_zero(scale):
    rng = random.Random(f"constant-{scale}")
    for _ in range(CASES):
        group_size, num_groups = rng.randint(2, 16), rng.randint(1, 6)
        rewards = torch.tensor([random_reward(rng) for _ in range(num_groups)]).repeat_interleave(group_size)
        adv = group_advantages(rewards, group_size, scale)
        assert torch.equal(adv, torch.zeros_like(adv)), (group_size, rewards)
        assert bool(tied_groups(rewards, group_size).all())


@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_weighted_sums_that_differ_only_by_rounding_are_tied(scale):
    """0.2 x format + 1.0 x correctness (and more functions), summed in another order per
    sample: the totals differ in their last bits, and that is not a reward signal. (Terms of
    one sign: a total that cancels terms far larger than itself keeps their rounding, which
    the tolerance, relative to the total, does not cover; the scorer sums every sample in one
    order, so equal scores give bit-equal totals there: see the scorer test below.)"""
    rng = random.Random(f"weighted-{scale}")
    rounding_differences = 0
    for _ in range(CASES):
        group_size = rng.randint(2, 16)
        num_functions = rng.randint(2, 5)
        weights = [rng.choice([0.2, 1.0, 0.1, 0.3, 1 / 3, 0.7, 0.05]) for _ in range(num_functions)]
        sign = rng.choice([-1, 1])
        scores = [sign * abs(random_reward(rng)) for _ in range(num_functions)]  # every sample scores the same
        rewards = torch.stack([weighted_sum_in_some_order(rng, scores, weights) for _ in range(group_size)])
        rounding_differences += int(rewards.max() != rewards.min())
        adv = group_advantages(rewards, group_size, scale)
        assert torch.equal(adv, torch.zeros_like(adv)), (weights, scores, rewards.tolist())
    assert rounding_differences > CASES // 10  # the property was really exercised by rounding


def test_the_scorer_gives_equal_scores_bit_equal_totals_even_when_weights_cancel():
    """RewardScorer adds the weighted components in one order for every sample, so samples
    that every reward function scores alike are tied exactly, cancellation or not."""
    rng = random.Random("scorer")
    for _ in range(CASES):
        group_size, num_functions = rng.randint(2, 16), rng.randint(2, 5)
        scores = [random_reward(rng) for _ in range(num_functions)]
        functions = [
            WeightedReward(
                f"f{k}",
                lambda prompts, completions, _v=scores[k], **_: [_v] * len(completions),
                rng.choice([0.2, 1.0, -0.5, 1 / 3, -1.0]),
            )
            for k in range(num_functions)
        ]
        total, _ = RewardScorer(functions)([""] * group_size, ["x"] * group_size, {})
        assert torch.equal(total, total[:1].expand_as(total))
        assert torch.equal(group_advantages(total, group_size), torch.zeros(group_size))


@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_groups_equal_but_one_keep_their_signal(scale):
    """One sample off by clearly more than the tie tolerance: the group is not tied; the odd
    sample's advantage has the sign of its difference and the others share one value."""
    rng = random.Random(f"odd-one-{scale}")
    for _ in range(CASES):
        group_size = rng.randint(2, 16)
        base = random_reward(rng)
        step = (TIE_ATOL + TIE_RTOL * abs(base)) * 10 ** rng.uniform(1.5, 6)
        odd_value = base + rng.choice([-1, 1]) * step
        odd = rng.randrange(group_size)
        group = [base] * group_size
        group[odd] = odd_value
        rewards = torch.tensor(group, dtype=torch.float64).float()
        assert not bool(tied_groups(rewards, group_size).any()), group
        adv = group_advantages(rewards, group_size, scale)
        assert_healthy(adv, rewards, group_size)
        assert torch.sign(adv[odd]) == torch.sign(rewards[odd].double() - rewards.double().mean()), (group, adv)
        others = torch.cat([adv[:odd], adv[odd + 1 :]])
        assert torch.equal(others, others[:1].expand_as(others))


@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_mixed_batches_zero_only_the_tied_groups(scale):
    """Batches mixing tied and untied groups: tied ones exactly 0, all finite, sums zero."""
    rng = random.Random(f"mixed-{scale}")
    for _ in range(CASES):
        group_size, num_groups = rng.randint(2, 16), rng.randint(2, 8)
        groups, tied = [], []
        for _ in range(num_groups):
            if rng.random() < 0.5:
                groups.append([random_reward(rng)] * group_size)
                tied.append(True)
            else:
                groups.append([random_reward(rng) for _ in range(group_size)])
                tied.append(False)
        rewards = torch.tensor(groups).view(-1)
        expected_tied = tied_groups(rewards, group_size)
        assert expected_tied.tolist() == [
            t or bool(rewards_equal(min(g), max(g))) for t, g in zip(tied, groups, strict=True)
        ]
        adv = group_advantages(rewards, group_size, scale).view(num_groups, group_size)
        assert (adv[expected_tied] == 0).all()
        assert_healthy(adv.view(-1), rewards, group_size)


def test_one_definition_of_equal():
    """The tolerance is relative to the rewards' magnitude, with a floor near zero."""
    assert bool(rewards_equal(1e6 + 0.5, 1e6 + 0.5 + 0.25))  # two float32 ulps at 1e6
    assert not bool(rewards_equal(1e6, 1e6 + 10))
    assert bool(rewards_equal(0.0, 5e-7)) and not bool(rewards_equal(0.0, 1e-5))
    assert bool(rewards_equal(torch.tensor(0.7, dtype=torch.float32).item(), 0.7))


# ----------------------------------------------------------------------------- end to end
@register_reward("test_constant_07")
def constant_07(prompts, completions, **_):
    return [0.7] * len(completions)


@register_reward("test_constant_01")
def constant_01(prompts, completions, **_):
    return [0.1] * len(completions)


@pytest.mark.parametrize("rewards", [{"test_constant_07": 1.0}, {"test_constant_07": 0.2, "test_constant_01": 1.0}])
def test_constant_rewards_leave_the_weights_untouched_and_raise_the_no_signal_alert(rewards):
    """Every reward a constant (0.7, or 0.2 x 0.7 + 1.0 x 0.1): no group carries signal, so no
    step may move the weights (before the fix every sample got |A| ~ 0.06 and they moved)."""
    captured = {}

    def snapshot(run):
        captured["before"] = {k: v.clone() for k, v in run.module.policy.state_dict().items()}

    window = 3
    run = fit(
        make_config(window + 1, **{"task.rewards": rewards, "health.reward_signal.window": window}), prepare=snapshot
    )
    assert run.fitted.global_step == window + 1
    after = run.module.policy.state_dict()
    assert all(torch.equal(captured["before"][k], after[k]) for k in after)
    assert torch.equal(run.module.last_step.advantages, torch.zeros_like(run.module.last_step.advantages))
    assert float(run.module.last_metrics["reward/frac_zero_std"]) == 1.0
    alerts = run.health.alerts_for("reward_signal")
    assert alerts and "100% of the groups had zero reward std" in alerts[0].evidence
