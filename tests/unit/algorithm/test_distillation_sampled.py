"""The sampled-token reverse KL as a per-token advantage (algorithm/distillation/reverse_kl.py, mixing.py):
its gradient through the policy loss against a hand-written one, its expectation against the reverse
KL's gradient, the discount, and the mixing with the reward advantages (never normalised)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_lightning.algorithm import MicroBatch, PreparedBatch, loss_normalizer, micro_batch_loss
from grpo_lightning.algorithm.distillation import DISTILL_SUMS, discounted_sums, mixed_advantages
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.records import TokenLogProbs


def algorithm(weight: float, discount: float = 0.0, **fields) -> AlgorithmConfig:
    cfg = AlgorithmConfig(beta=0.0, **fields)
    cfg.teacher.kind, cfg.teacher.weight = "context", weight
    cfg.teacher.reverse_kl.discount = discount
    return cfg


def batch(mask: torch.Tensor) -> MicroBatch:
    b, c = mask.shape
    return MicroBatch(slice(0, b), torch.zeros(b, c + 1, dtype=torch.long), torch.ones(b, c + 1), 1, mask, None)


def by_hand_discount(values: list[float], mask: list[bool], gamma: float) -> list[float]:
    """A_t = sum over the masked k >= t of gamma^(masked tokens strictly between t and k) x values_k."""
    out = []
    for t in range(len(values)):
        if not mask[t]:
            out.append(0.0)
            continue
        total, steps = 0.0, 0
        for k in range(t, len(values)):
            if mask[k]:
                total += gamma**steps * values[k]
                steps += 1
        out.append(total)
    return out


def test_discount_counts_only_the_models_own_tokens():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        b, c = torch.randint(1, 4, (2,), generator=generator).tolist()
        c += 3
        values = torch.randn(b, c, generator=generator, dtype=torch.float64)
        mask = torch.rand(b, c, generator=generator) < 0.6  # False: an environment's token or padding
        gamma = float(torch.rand((), generator=generator)) if _ % 4 else 0.0
        got = discounted_sums(values, mask, gamma)
        for i in range(b):
            want = by_hand_discount(values[i].tolist(), mask[i].tolist(), gamma)
            assert got[i].tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("loss_agg", ["seq_mean_token_mean", "token_mean"])
def test_gradient_equals_the_hand_written_one_on_random_cases(loss_agg):
    """A = A_reward + weight x discounted(log nu - log pi_old), through the clipped surrogate (old != new on
    half the cases, so some tokens are clipped): grad over the logits, written out token by token."""
    generator = torch.Generator().manual_seed(1)
    clipped_seen = 0
    for case in range(60):
        b, c, v = 3, 5, 6
        logits = torch.randn(b, c, v, generator=generator, dtype=torch.float64).requires_grad_(True)
        targets = torch.randint(0, v, (b, c), generator=generator)
        mask = torch.rand(b, c, generator=generator) < 0.75
        mask[:, 0] = True
        teacher = torch.log_softmax(torch.randn(b, c, v, generator=generator, dtype=torch.float64), -1)
        teacher_logp = teacher.gather(-1, targets[..., None])[..., 0]
        logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
        old = logp.detach() + (0.3 * torch.randn(b, c, generator=generator, dtype=torch.float64) if case % 2 else 0.0)
        reward_adv = torch.randn(b, generator=generator, dtype=torch.float64)
        weight, gamma = float(torch.rand((), generator=generator) * 2), [0.0, 0.5, 1.0][case % 3]
        cfg = algorithm(weight, gamma, loss_agg=loss_agg)
        prepared = PreparedBatch(
            [],
            reward_adv,
            loss_normalizer(mask, loss_agg),
            c,
            None,
            TokenLogProbs(old, None, torch.ones(b, c, dtype=torch.bool)),
            teacher=TokenLogProbs(teacher_logp, None, torch.ones(b, c, dtype=torch.bool)),
        )
        policy = TokenLogProbs(logp, None, torch.ones(b, c, dtype=torch.bool))
        micro_batch_loss(policy, batch(mask), prepared, cfg).loss.backward()

        want = torch.zeros_like(logits)
        probs = torch.softmax(logits.detach(), -1)
        for i in range(b):
            terms = (teacher_logp[i] - old[i]).tolist()
            teacher_adv = by_hand_discount(terms, mask[i].tolist(), gamma)
            length = int(mask[i].sum())
            for t in range(c):
                if not mask[i, t]:
                    continue
                adv = float(reward_adv[i]) + weight * teacher_adv[t]
                ratio = math.exp(float(logp[i, t].detach() - old[i, t]))
                clipped = (adv > 0 and ratio > 1.2) or (adv < 0 and ratio < 0.8)
                clipped_seen += clipped
                d_logp = 0.0 if clipped else -adv * ratio
                share = 1.0 / (length * b) if loss_agg == "seq_mean_token_mean" else 1.0 / int(mask.sum())
                onehot = torch.zeros(v, dtype=torch.float64)
                onehot[targets[i, t]] = 1.0
                want[i, t] = share * d_logp * (onehot - probs[i, t])
        assert torch.allclose(logits.grad, want, atol=1e-10), case
    assert clipped_seen > 10


def test_its_expectation_is_the_reverse_kl_gradient():
    """Exactly, over a small vocabulary: sum_y pi(y) grad[loss of sampling y] = grad KL(pi || nu). Had the
    student's log-prob inside the advantage kept its gradient (AReaL's joint mode), the teacher would drop out."""
    generator = torch.Generator().manual_seed(2)
    for _ in range(30):
        v = 7
        logits = torch.randn(v, generator=generator, dtype=torch.float64) * 2
        nu = torch.log_softmax(torch.randn(v, generator=generator, dtype=torch.float64) * 2, -1)
        pi = torch.softmax(logits, -1)
        total = torch.zeros(v, dtype=torch.float64)
        for y in range(v):
            leaf = logits.clone().requires_grad_(True)
            logp = torch.log_softmax(leaf, -1)[y].reshape(1, 1)
            mask = torch.ones(1, 1, dtype=torch.bool)
            prepared = PreparedBatch(
                [], torch.zeros(1, dtype=torch.float64), torch.tensor(1.0), 1, None, None,
                teacher=TokenLogProbs(nu[y].reshape(1, 1), None, mask),
            )  # fmt: skip
            micro_batch_loss(TokenLogProbs(logp, None, mask), batch(mask), prepared, algorithm(1.0)).loss.backward()
            total += pi[y] * leaf.grad
        leaf = logits.clone().requires_grad_(True)
        lp = torch.log_softmax(leaf, -1)
        (lp.exp() * (lp - nu)).sum().backward()
        assert torch.allclose(total, leaf.grad, atol=1e-12)


def test_group_normalisation_never_scales_the_teacher_term():
    """The teacher's advantage is weight x (log nu - log pi) whatever the reward advantages (their group
    statistics, their scale): scaling the rewards changes the reward part only."""
    generator = torch.Generator().manual_seed(3)
    cfg = algorithm(0.7)
    for _ in range(50):
        b, c = 4, 6
        student, teacher = torch.randn(2, b, c, generator=generator)
        mask = (torch.rand(b, c, generator=generator) < 0.8).float()
        for scale in (0.0, 1.0, 25.0):
            reward = scale * torch.randn(b, generator=generator)
            total, term = mixed_advantages(reward, student, teacher, mask, cfg.teacher)
            assert torch.allclose(term, 0.7 * (teacher - student) * mask)
            assert torch.allclose(total, reward[:, None] + term)


def test_distill_sums_are_the_k1_and_k3_estimates():
    generator = torch.Generator().manual_seed(4)
    student, teacher = torch.randn(2, 3, 5, generator=generator)
    mask = (torch.rand(3, 5, generator=generator) < 0.7).float()
    prepared = PreparedBatch(
        [], torch.zeros(3), torch.tensor(3.0), 5, None, None, teacher=TokenLogProbs(teacher, None, mask.bool() | True)
    )
    terms = micro_batch_loss(
        TokenLogProbs(student, None, mask.bool() | True), batch(mask.bool()), prepared, algorithm(2.0)
    )
    sums = dict(zip(DISTILL_SUMS, terms.distill.tolist(), strict=True))
    r = teacher - student
    assert sums["kl"] == pytest.approx(float((-r * mask).sum()), rel=1e-5)
    assert sums["kl_k3"] == pytest.approx(float(((r.exp() - 1 - r) * mask).sum()), rel=1e-5)
    assert sums["advantage"] == pytest.approx(float((2.0 * r * mask).sum()), rel=1e-5)
    assert sums["tokens"] == float(mask.sum()) and sums["sequences"] == float((mask.sum(1) > 0).sum())


def test_a_non_finite_teacher_log_prob_drops_its_sequence():
    mask = torch.ones(2, 3, dtype=torch.bool)
    finite = torch.ones(2, 3, dtype=torch.bool)
    finite[1, 2] = False
    prepared = PreparedBatch(
        [], torch.zeros(2), torch.tensor(2.0), 3, None, None, teacher=TokenLogProbs(torch.zeros(2, 3), None, finite)
    )
    policy = TokenLogProbs(torch.zeros(2, 3, requires_grad=True), None, torch.ones(2, 3, dtype=torch.bool))
    terms = micro_batch_loss(policy, batch(mask), prepared, algorithm(1.0))
    assert terms.kept.tolist() == [True, False]
