"""Properties of the pure algorithm functions, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_lightning.algorithm import (
    LOSS_AGG_MODES,
    aggregate,
    clipped_surrogate,
    group_advantages,
    kl_estimate,
    lm_head_log_probs,
    loss_normalizer,
    selective_log_probs,
)


# ----------------------------------------------------------------------------- advantages
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_sum_to_zero_within_each_group(scale):
    rewards = torch.rand(6 * 5, generator=torch.Generator().manual_seed(0)) * 3
    adv = group_advantages(rewards, group_size=5, scale=scale)
    assert torch.allclose(adv.view(6, 5).sum(dim=1), torch.zeros(6), atol=1e-5)
    assert adv.abs().sum() > 0


def test_advantages_hand_computed():
    rewards = torch.tensor([1.0, 3.0, 0.0, 0.0])  # groups of 2: [1, 3] and [0, 0]
    mean_centered = torch.tensor([-1.0, 1.0, 0.0, 0.0])
    group_std = math.sqrt(2.0)  # unbiased std of [1, 3]
    batch_std = torch.tensor([1.0, 3.0, 0.0, 0.0]).std().item()
    assert torch.allclose(group_advantages(rewards, 2, "none"), mean_centered)
    assert torch.allclose(group_advantages(rewards, 2, "group"), mean_centered / (group_std + 1e-6))
    assert torch.allclose(group_advantages(rewards, 2, "batch"), mean_centered / (batch_std + 1e-6))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_std_and_singleton_groups_give_zero_not_nan(scale):
    constant = group_advantages(torch.full((8,), 0.7), group_size=4, scale=scale)
    singleton = group_advantages(torch.tensor([0.1, 5.0, -2.0]), group_size=1, scale=scale)
    assert torch.equal(constant, torch.zeros(8))
    assert torch.equal(singleton, torch.zeros(3))


def test_advantages_reject_bad_shapes():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(4), group_size=3)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(4), group_size=2, scale="rank")


# ----------------------------------------------------------------------------- KL
def test_kl_estimators_match_their_formulas():
    logp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    d = logp - ref
    assert torch.allclose(kl_estimate(logp, ref, "k1"), d)
    assert torch.allclose(kl_estimate(logp, ref, "k2"), 0.5 * d**2)
    assert torch.allclose(kl_estimate(logp, ref, "k3"), torch.exp(-d) + d - 1)
    assert kl_estimate(logp, ref, "k3")[2] == 0.0  # identical distributions


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_finite_for_extreme_log_ratios(kind):
    logp = torch.tensor([1e4, -1e4, float("-inf"), 0.0, -50.0], requires_grad=True)
    ref = torch.tensor([0.0, 0.0, 0.0, float("-inf"), 50.0])
    kl = kl_estimate(logp, ref, kind)
    assert torch.isfinite(kl).all()
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    if kind != "k1":
        assert (kl >= 0).all()
    if kind == "k3":
        assert kl.max() <= 10.0


# ----------------------------------------------------------------------------- policy loss
def test_ratio_one_gives_minus_advantage_and_its_gradient():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    out = clipped_surrogate(logp, logp.detach(), adv)
    assert torch.equal(out.ratio, torch.ones(2, 2))
    assert torch.allclose(out.loss, torch.tensor([[-2.0, -2.0], [1.0, 1.0]]))
    out.loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2.0, -2.0], [1.0, 1.0]]))


def test_clipping_hand_computed():
    old = torch.zeros(1, 4)
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    out = clipped_surrogate(ratios.log(), old, adv, clip_low=0.2, clip_high=0.3)
    # A>0: min(1.5, 1.3) = 1.3 ; min(0.5, 0.8) = 0.5 ; A<0: min(-1.5, -1.3) = -1.5 ; min(-0.5, -0.8) = -0.8
    assert torch.allclose(out.loss, torch.tensor([[-1.3, -0.5, 1.5, 0.8]]))
    assert out.clipped_high.tolist() == [[True, False, False, False]]
    assert out.clipped_low.tolist() == [[False, False, False, True]]
    low, high = out.clip_fractions(torch.tensor([[1, 1, 1, 1]]))
    assert (low.item(), high.item()) == (0.25, 0.25)
    low, high = out.clip_fractions(torch.tensor([[0, 1, 1, 0]]))  # both clipped tokens masked out
    assert (low.item(), high.item()) == (0.0, 0.0)


def test_dual_clip_bounds_negative_advantages():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(10.0), math.log(10.0)]])
    adv = torch.tensor([[-1.0, 1.0]])
    out = clipped_surrogate(logp, old, adv, dual_clip=3.0)
    assert torch.allclose(out.loss, torch.tensor([[3.0, -1.2]]))  # -A*c for A<0 ; clipped for A>0
    assert out.dual_clipped.tolist() == [[True, False]]


def test_policy_loss_survives_huge_log_ratios():
    logp = torch.tensor([[1e4, -1e4]], requires_grad=True)
    out = clipped_surrogate(logp, torch.zeros(1, 2), torch.tensor([1.0]))
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(logp.grad).all()


# ----------------------------------------------------------------------------- aggregation
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_mean", (1 + 2 + 3 + 4) / 4),
        ("seq_mean_token_mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("seq_mean_token_sum", ((1 + 2 + 3) + 4) / 2),
        ("seq_mean_token_sum_norm", (1 + 2 + 3 + 4) / (2 * 5)),
    ],
)
def test_aggregation_hand_computed(mode, expected):
    assert aggregate(LOSS, MASK, mode, max_len=5).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_with_global_normalizer_sum_to_full_batch(mode):
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(8, 6, generator=gen)
    mask = (torch.rand(8, 6, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    full = aggregate(loss, mask, mode, max_len=6)
    norm = loss_normalizer(mask, mode, max_len=6)
    parts = sum(aggregate(loss[i : i + 3], mask[i : i + 3], mode, norm) for i in range(0, 8, 3))
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_unknown_aggregation_mode_names_the_choices():
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        aggregate(LOSS, MASK, "sequence_mean")


# ----------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("chunk_size", [1, 5, 4096])
def test_selective_log_probs_match_log_softmax(chunk_size):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=gen) * 4
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    out = selective_log_probs(logits, targets, temperature=0.7, chunk_size=chunk_size, with_entropy=True)
    ref = torch.log_softmax(logits / 0.7, dim=-1)
    assert torch.allclose(out.logp, ref.gather(-1, targets[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(out.entropy, -(ref.exp() * ref).sum(-1), atol=1e-5)
    assert out.finite.all()


def test_non_finite_logits_are_flagged_and_never_reach_the_gradient():
    logits = torch.randn(2, 3, 10)
    logits[0, 1, 4] = float("nan")
    logits[1, 2, 0] = float("inf")
    logits.requires_grad_(True)
    targets = torch.zeros(2, 3, dtype=torch.long)
    out = selective_log_probs(logits, targets)
    assert out.finite.tolist() == [[True, False, True], [True, True, False]]
    assert torch.isfinite(out.logp).all()
    out.logp.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 1].abs().sum() == 0  # the poisoned position got no gradient


@pytest.mark.parametrize("chunk_size", [3, 1024])
def test_lm_head_log_probs_match_full_logits_in_value_and_gradient(chunk_size):
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 30, bias=False)
    hidden = torch.randn(2, 5, 8, generator=gen, requires_grad=True)
    targets = torch.randint(0, 30, (2, 5), generator=gen)
    weights = torch.rand(2, 5, generator=gen)

    ours = lm_head_log_probs(hidden, head, targets, temperature=0.9, chunk_size=chunk_size, with_entropy=True)
    (ours.logp * weights).sum().backward()
    ours_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    plain = torch.log_softmax(head(hidden) / 0.9, dim=-1)
    (plain.gather(-1, targets[..., None]).squeeze(-1) * weights).sum().backward()
    assert torch.allclose(ours.logp, plain.gather(-1, targets[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(ours.entropy, -(plain.exp() * plain).sum(-1), atol=1e-5)
    assert torch.allclose(ours_grads[0], hidden.grad, atol=1e-5)
    assert torch.allclose(ours_grads[1], head.weight.grad, atol=1e-5)
