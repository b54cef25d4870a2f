"""The registered objectives on small hand-computed cases: GSPO, CISPO, SAPO policy losses,
the RLOO, REINFORCE++ and Dr. GRPO advantage estimators (tied groups included), the entropy
bonus and the learning-rate schedules; and a short run of each loss with the F5 check on."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import fit, gradients, make_config

from grpo_lightning.algorithm import POLICY_LOSSES, PolicyLossInputs, compute_advantages, selective_log_probs
from grpo_lightning.algorithm.lr_schedule import lr_factor
from grpo_lightning.config import AlgorithmConfig


def _loss(name, logp, old_logp, advantages, mask=None, **cfg):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(old_logp, dtype=torch.float64)
    mask = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float64)
    out = POLICY_LOSSES[name].fn(
        PolicyLossInputs(logp, old, torch.tensor(advantages, dtype=torch.float64), mask), AlgorithmConfig(**cfg)
    )
    (out.loss * mask).sum().backward()
    return out, logp.grad


def test_gspo_uses_the_geometric_mean_ratio_of_the_sequence_and_clips_it_whole():
    # sequence 0: token ratios 2 and 1/2 -> geometric mean exactly 1 (the token ratios are far
    # outside [0.8, 1.2], so token-level GRPO would clip both); sequence 1: log-ratios 0.1 and
    # 0.3 -> s = e^0.2 = 1.2214 > 1.2; the third token of sequence 1 is padding.
    logp = [[math.log(0.5), math.log(0.2), 0.0], [-1.0, -2.0, -5.0]]
    old = [[math.log(0.25), math.log(0.4), 0.0], [-1.1, -2.3, 0.0]]
    mask = [[1, 1, 0], [1, 1, 0]]
    out, grad = _loss("gspo", logp, old, [2.0, 1.0], mask)
    assert out.loss[0, :2].tolist() == pytest.approx([-2.0, -2.0])  # ratio 1: -A
    assert grad[0, :2].tolist() == pytest.approx([-2.0, -2.0])  # -A * s * d logp, s = 1
    # A > 0 and s above 1 + clip_high: the whole sequence is clipped, value -1.2 A, no gradient
    assert out.loss[1, :2].tolist() == pytest.approx([-1.2, -1.2])
    assert grad[1].tolist() == [0.0, 0.0, 0.0]
    assert out.clipped_high[1, :2].all() and not out.clipped_high[0].any()
    assert out.ratio[1, 0].item() == pytest.approx(math.exp(0.2))
    # A < 0: min(sA, clip(s)A) takes the unclipped sA, gradient -A * s on each token
    out, grad = _loss("gspo", logp, old, [2.0, -1.0], mask)
    assert out.loss[1, :2].tolist() == pytest.approx([math.exp(0.2)] * 2)
    assert grad[1, :2].tolist() == pytest.approx([math.exp(0.2)] * 2)


def test_cispo_clips_the_weight_and_keeps_the_gradient():
    # ratio e^0.4 = 1.49 with A = 1: GRPO's clip zeroes this token's gradient, CISPO keeps it
    # scaled by the clipped weight 1.2; ratio e^-0.5 = 0.61 with A = -1: weight 0.8.
    out, grad = _loss("cispo", [[0.4, -0.5]], [[0.0, 0.0]], [1.0])
    assert out.loss[0, 0].item() == pytest.approx(-1.2)
    assert grad[0, 0].item() == pytest.approx(-1.2)
    assert grad[0, 1].item() == pytest.approx(-0.8)
    assert out.clipped_high[0].tolist() == [True, False] and out.clipped_low[0].tolist() == [False, True]
    _, grpo_grad = _loss("grpo", [[0.4, -0.5]], [[0.0, 0.0]], [1.0])
    assert grpo_grad[0, 0].item() == 0.0
    # at ratio 1: value -A (the F5 identity it declares), gradient -A
    out, grad = _loss("cispo", [[-1.0, -2.0]], [[-1.0, -2.0]], [0.5])
    assert out.loss.tolist() == [[-0.5, -0.5]] and grad.tolist() == [[-0.5, -0.5]]
    assert POLICY_LOSSES["cispo"].ratio_one_identity and POLICY_LOSSES["gspo"].ratio_one_identity


def test_sapo_soft_gate():
    # f(r) = 4/tau sigmoid(tau (r - 1)); at r = 1 the value is 2/tau, the gradient weight 1
    out, grad = _loss("sapo", [[-1.0]], [[-1.0]], [1.0])
    assert out.loss.item() == pytest.approx(-2.0) and grad.item() == pytest.approx(-1.0)
    out, grad = _loss("sapo", [[-1.0]], [[-1.0]], [-1.0])  # tau_neg = 1.05
    assert out.loss.item() == pytest.approx(2 / 1.05) and grad.item() == pytest.approx(1.0)
    # r = e^0.5, A = -1, tau = 1.05: value 4/1.05 sigmoid(1.05 (r - 1)); gradient 4 s (1 - s) r
    r = math.exp(0.5)
    s = 1 / (1 + math.exp(-1.05 * (r - 1)))
    out, grad = _loss("sapo", [[0.5]], [[0.0]], [-1.0])
    assert out.loss.item() == pytest.approx(4 / 1.05 * s)
    assert grad.item() == pytest.approx(4 * s * (1 - s) * r)
    assert not out.clipped_low.any() and not out.clipped_high.any()
    assert not POLICY_LOSSES["sapo"].ratio_one_identity  # 2/tau * A is not A


R = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.7, 0.7, 0.7, 0.7, 0.0, 1.0, 1.0, 0.0])


def _adv(name, rewards=R, group_size=4):
    return compute_advantages(rewards, group_size, AlgorithmConfig(advantage_estimator=name))


def test_rloo_leave_one_out_baseline():
    a = _adv("rloo")
    # 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3; a tied group: exactly 0
    assert a[:4].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert a[4:8].tolist() == [0.0] * 4
    assert a[8:].tolist() == pytest.approx([-2 / 3, 2 / 3, 2 / 3, -2 / 3])


def test_dr_grpo_centers_without_std():
    a = _adv("dr_grpo")
    assert a[:4].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert a[4:8].tolist() == [0.0] * 4
    assert torch.equal(a, compute_advantages(R, 4, AlgorithmConfig(advantage_scale="none")))


def test_reinforce_pp_whitens_over_the_batch():
    # rewards [1, 0 | 1, 1]: the tied group keeps its signal against the batch mean 0.75;
    # unbiased std of [1, 0, 1, 1] is 0.5
    a = _adv("reinforce_pp", torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    assert a.tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5], rel=1e-5)


def test_reinforce_pp_tied_groups_get_no_signal_from_rounding():
    seven = torch.tensor(0.7, dtype=torch.float32)
    ulp = torch.nextafter(seven, torch.tensor(1.0))  # 0.7 one float32 ulp up: the same reward
    rewards = torch.stack([seven, ulp, seven, ulp, torch.tensor(0.0), torch.tensor(1.0)])
    a = _adv("reinforce_pp", rewards, 2)
    assert a[0] == a[1] and a[2] == a[3]  # bit-equal within each tied group
    # a whole batch of one reward (up to rounding): every advantage exactly 0, never x / eps
    assert _adv("reinforce_pp", torch.stack([seven, ulp, ulp, seven]), 2).tolist() == [0.0] * 4
    for name in ("rloo", "dr_grpo"):
        assert _adv(name, torch.stack([seven, ulp, ulp, seven]), 2).tolist() == [0.0] * 4


def test_entropy_bonus_is_a_separate_term_with_its_gradient(policy, rollout):
    settings = dict(micro_batch_size=16, loss_agg="token_mean", beta=0.0)
    base, base_stats = gradients(policy, rollout, **settings)
    bonus, stats = gradients(policy, rollout, entropy_coef=0.5, **settings)
    assert stats.aggregation["entropy"] == stats.aggregation["policy"]  # one mode, one normalizer (F5)
    mean_entropy = stats.entropy_sum / stats.kept_tokens
    assert stats.loss == pytest.approx(base_stats.loss - 0.5 * mean_entropy, abs=1e-5)
    assert stats.policy_loss == pytest.approx(base_stats.policy_loss, abs=1e-7)  # the F5 check reads this
    # the gradient difference is -0.5 x grad(token-mean entropy), computed here on a separate path
    copy_ = type(policy)(policy.config)
    copy_.load_state_dict(policy.state_dict())
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attn = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    width = rollout.prompt_ids.shape[1]
    logits = copy_(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
    out = selective_log_probs(logits[:, width - 1 : -1], ids[:, width:], with_entropy=True, entropy_grad=True)
    mask = rollout.completion_mask.float()
    ((out.entropy * mask).sum() / mask.sum()).backward()
    expected = {n: p.grad for n, p in copy_.named_parameters() if p.grad is not None}
    for name in base:
        diff = bonus[name] - base[name]
        assert torch.allclose(diff, -0.5 * expected[name], rtol=1e-3, atol=1e-6), name


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_entropy_bonus_accumulates_exactly(policy, rollout, mode):
    """F4 with the entropy term: 1 micro-batch of 16 == 16 of 1."""
    settings = dict(loss_agg=mode, beta=0.1, entropy_coef=0.3)
    whole, whole_stats = gradients(policy, rollout, micro_batch_size=16, **settings)
    split, split_stats = gradients(policy, rollout, micro_batch_size=1, **settings)
    for name in whole:
        scale = whole[name].abs().max().clamp(min=1e-8)
        assert (whole[name] - split[name]).abs().max() / scale < 1e-5, name
    assert split_stats.loss == pytest.approx(whole_stats.loss, abs=1e-6)


def test_lr_schedules():
    assert [lr_factor(s, "constant", 2, 10) for s in range(4)] == pytest.approx([1 / 3, 2 / 3, 1, 1])
    assert [lr_factor(s, "linear", 2, 10) for s in (2, 6, 10)] == pytest.approx([1.0, 0.5, 0.0])
    assert [lr_factor(s, "cosine", 0, 4) for s in range(5)] == pytest.approx(
        [1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2, 0.0]
    )
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_factor(0, "step", 0, 4)


@pytest.mark.parametrize("loss", ["grpo", "gspo", "cispo", "sapo"])
def test_short_run_of_each_loss_keeps_the_f5_check_quiet(loss):
    """A short run with the loss, an entropy bonus, cosine decay and a non-trivial normalizer
    (token_mean): no alert; the F5 value check runs exactly when the loss declares the identity."""
    cfg = make_config(
        4,
        **{
            "algorithm.policy_loss": loss,
            "algorithm.loss_agg": "token_mean",
            "algorithm.entropy_coef": 0.01,
            "algorithm.lr_schedule": "cosine",
            "algorithm.warmup_steps": 1,
            "rollout.prompts_per_step": 4,
        },
    )
    run = fit(cfg)
    assert run.health.alerts_for("normalization") == []
    checked = "health/normalization/policy_term_error" in run.health.last_metrics
    assert checked == POLICY_LOSSES[loss].ratio_one_identity
    # cosine to 0 at max_steps: the last step the scheduler set is lr x 0
    assert run.module.optimizers().param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
