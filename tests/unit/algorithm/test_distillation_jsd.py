"""The full-distribution objective (algorithm/distillation/jsd.py, divergence.py): chunked over the
vocabulary, it equals the divergence written out over explicit [B, T, V] logits, value and gradient,
at beta 0 (forward KL), 0.5 and 1 (reverse KL) and between; and the JSD's own identities."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_lightning.algorithm import MicroBatch, PreparedBatch, micro_batch_loss
from grpo_lightning.algorithm.distillation import (
    TEACHER_OBJECTIVES,
    HeadRows,
    JSDOptions,
    chunked_jsd,
    divergence_rows,
    jsd_from_logits,
)
from grpo_lightning.algorithm.distillation.objectives import TeacherObjective
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.records import TokenLogProbs


def explicit(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """[B, T, V] logits (already over the temperature) -> [B, T], term by term as GKD / TRL define it."""
    p, q = torch.softmax(student, -1), torch.softmax(teacher, -1)
    if beta == 0.0:
        return (q * (q.log() - p.log())).sum(-1)
    if beta == 1.0:
        return (p * (p.log() - q.log())).sum(-1)
    m = beta * q + (1 - beta) * p
    return beta * (q * (q.log() - m.log())).sum(-1) + (1 - beta) * (p * (p.log() - m.log())).sum(-1)


def case(generator, b=2, t=5, hidden=8, vocab=50, teacher_vocab=None, bias=False):
    dt = torch.float64
    h = torch.randn(b, t, hidden, generator=generator, dtype=dt).requires_grad_(True)
    w = (torch.randn(vocab, hidden, generator=generator, dtype=dt) * 0.7).requires_grad_(True)
    bb = torch.randn(vocab, generator=generator, dtype=dt).requires_grad_(True) if bias else None
    ht = torch.randn(b, t, hidden + 3, generator=generator, dtype=dt)
    wt = torch.randn(teacher_vocab or vocab, hidden + 3, generator=generator, dtype=dt) * 0.7
    return h, w, bb, ht, wt


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 0.2, 0.9])
def test_chunked_equals_the_explicit_divergence_on_random_cases(beta):
    generator = torch.Generator().manual_seed(int(beta * 10))
    for index in range(12):
        vocab = int(torch.randint(10, 300, (), generator=generator))
        teacher_vocab = vocab + (7 if index % 3 == 0 else 0)  # a teacher head padded past the shared vocabulary
        h, w, bb, ht, wt = case(generator, vocab=vocab, teacher_vocab=teacher_vocab, bias=index % 2 == 1)
        temperature = [1.0, 0.7, 1.3][index % 3]
        upstream = torch.randn(2, 5, generator=generator, dtype=torch.float64)
        z_s = (h @ w.T + (bb if bb is not None else 0.0)) / temperature
        z_t = (ht @ wt[:vocab].T) / temperature
        want = explicit(z_s, z_t, beta)
        want_grads = torch.autograd.grad((want * upstream).sum(), [h, w] + ([bb] if bb is not None else []))
        budget = float(torch.rand((), generator=generator)) * 0.05 + 1e-4  # blocks from 256 columns to all of them
        got, finite = chunked_jsd(
            HeadRows(h.reshape(-1, 8), w, bb), HeadRows(ht.reshape(-1, 11), wt), beta, temperature, budget
        )
        assert bool(finite.all())
        got = got.view(2, 5)
        grads = torch.autograd.grad((got * upstream).sum(), [h, w] + ([bb] if bb is not None else []))
        assert torch.allclose(got, want, atol=1e-11), (beta, index)
        for a, b in zip(grads, want_grads, strict=True):
            assert torch.allclose(a, b, atol=1e-11), (beta, index)


def test_the_module_form_is_the_explicit_one():
    generator = torch.Generator().manual_seed(5)
    for beta in (0.0, 0.5, 1.0):
        z_s, z_t = torch.randn(2, 3, 4, 40, generator=generator, dtype=torch.float64)
        assert torch.allclose(jsd_from_logits(z_s, z_t, beta), explicit(z_s, z_t, beta), atol=1e-12)


def test_jsd_identities():
    """0 <= JSD_beta <= H(beta) <= ln 2, 0 at pi = nu, and JSD_beta / beta -> KL(nu || pi) as beta -> 0."""
    generator = torch.Generator().manual_seed(6)
    for _ in range(100):
        z_s, z_t = torch.randn(2, 30, generator=generator, dtype=torch.float64) * 3
        beta = float(torch.rand((), generator=generator)) * 0.98 + 0.01
        value = float(jsd_from_logits(z_s, z_t, beta))
        entropy = -(beta * math.log(beta) + (1 - beta) * math.log(1 - beta))
        assert -1e-12 <= value <= entropy + 1e-12 <= math.log(2) + 1e-12
        assert abs(float(jsd_from_logits(z_s, z_s, beta))) < 1e-12
        forward = float(jsd_from_logits(z_s, z_t, 0.0))
        assert float(jsd_from_logits(z_s, z_t, 1e-9)) / 1e-9 == pytest.approx(forward, rel=1e-3)


def test_a_plug_in_divergence_gets_row_chunks_of_its_logits():
    """An objective without a chunked form: rows a chunk at a time (checkpointed), the same numbers."""
    generator = torch.Generator().manual_seed(7)
    h, w, _, ht, wt = case(generator, b=3, t=40, vocab=64)
    plug_in = TeacherObjective("my_div", divergence=lambda zs, zt, o: jsd_from_logits(zs, zt, 0.3))
    value, finite = divergence_rows(
        plug_in, HeadRows(h.reshape(-1, 8), w), HeadRows(ht.reshape(-1, 11), wt), None, 0.9, 0.01
    )  # 0.01 MB: a few rows per chunk
    want = explicit((h @ w.T) / 0.9, (ht @ wt.T) / 0.9, 0.3).reshape(-1)
    assert bool(finite.all()) and torch.allclose(value, want, atol=1e-11)
    (g1,) = torch.autograd.grad(value.sum(), [w])
    (g2,) = torch.autograd.grad(want.sum(), [w])
    assert torch.allclose(g1, g2, atol=1e-11)


def test_a_non_finite_row_gets_zero_no_gradient_and_is_marked():
    generator = torch.Generator().manual_seed(8)
    h, w, _, ht, wt = case(generator, b=1, t=4)
    rows = h.reshape(-1, 8).detach().clone()
    rows[2, 0] = float("inf")
    rows.requires_grad_(True)
    value, finite = chunked_jsd(HeadRows(rows, w), HeadRows(ht.reshape(-1, 11), wt), 0.5, 1.0, 1.0)
    assert finite.tolist() == [True, True, False, True] and float(value[2].detach()) == 0.0
    value.sum().backward()
    assert torch.isfinite(rows.grad).all() and float(rows.grad[2].abs().sum()) == 0.0


def test_the_divergence_term_is_added_with_its_weight_and_aggregated_like_the_others():
    cfg = AlgorithmConfig(beta=0.0)
    cfg.teacher.kind, cfg.teacher.objective, cfg.teacher.weight = "context", "jsd", 0.25
    assert TEACHER_OBJECTIVES["jsd"].full_distribution and isinstance(cfg.teacher.jsd, JSDOptions)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    mb = MicroBatch(slice(0, 2), torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4), 1, mask, None)
    ones = torch.ones(2, 3, dtype=torch.bool)
    prepared = PreparedBatch(
        [], torch.zeros(2), torch.tensor(2.0), 3, None, None, teacher=TokenLogProbs(torch.zeros(2, 3), None, ones)
    )
    divergence = torch.tensor([[0.4, 0.2, 9.0], [1.0, 9.0, 9.0]], requires_grad=True)
    policy = TokenLogProbs(torch.zeros(2, 3, requires_grad=True), None, ones)
    terms = micro_batch_loss(policy, mb, prepared, cfg, (divergence, ones))
    assert float(terms.loss) == pytest.approx(0.25 * ((0.4 + 0.2) / 2 + 1.0) / 2)  # seq_mean_token_mean
    assert set(terms.aggregation) == {"policy", "distill"}
