"""The KL term's gradient is that of the KL the loss reports, KL(policy || reference).

Sampled on-policy, k3's own gradient averages to the forward KL(ref || policy)'s; on the tiny
arithmetic task that weaker pull let the policy's entropy collapse and the reward stall well
below TRL's (benchmarks/results/LOG.md, "Time to accuracy"). Exact expectations over a small vocabulary,
so no sampling noise: sum_x pi(x) grad[estimate(x)] against autograd on the closed-form KL.
"""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.algorithm import MicroBatch, PreparedBatch, micro_batch_loss
from grpo_lightning.algorithm.kl import K3_OUTPUT_CLAMP, kl_estimate, ratio_weighted
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.records import TokenLogProbs


def expected_gradient(logits: torch.Tensor, ref_logp: torch.Tensor, kind: str, corrected: bool) -> torch.Tensor:
    """grad over logits of E_{x ~ pi}[estimate(x)] taken token by token, as the loss takes it (pi_old = pi)."""
    logits = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)
    kl = kl_estimate(logp, ref_logp, kind)
    if corrected:
        kl = ratio_weighted(kl, logp, logp.detach(), ref_logp)
    (logp.detach().exp() * kl).sum().backward()  # the sampling weights pi(x) carry no gradient
    return logits.grad


def reverse_kl_gradient(logits: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    logits = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)
    (logp.exp() * (logp - ref_logp)).sum().backward()
    return logits.grad


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_corrected_term_has_the_reverse_kl_gradient(kind):
    """Whatever the estimator, and where k3 is clamped too (logits spread enough to reach its ceiling)."""
    generator = torch.Generator().manual_seed(0)
    clamped = 0
    for _ in range(50):
        logits, ref_logits = torch.randn(2, 7, generator=generator) * 3
        ref_logp = torch.log_softmax(ref_logits, -1)
        clamped += int((kl_estimate(torch.log_softmax(logits, -1), ref_logp) >= K3_OUTPUT_CLAMP).any())
        want = reverse_kl_gradient(logits, ref_logp)
        assert torch.allclose(expected_gradient(logits, ref_logp, kind, True), want, atol=1e-5)
    assert clamped > 5


def test_uncorrected_k3_has_the_forward_kl_gradient_instead():
    """What the loss did before ``algorithm.kl_bias_correction``: the gradient of KL(ref || pi)."""
    generator = torch.Generator().manual_seed(1)
    logits, ref_logits = torch.randn(2, 7, generator=generator)
    ref_logp = torch.log_softmax(ref_logits, -1)
    got = expected_gradient(logits, ref_logp, "k3", False)
    leaf = logits.clone().requires_grad_(True)
    (-(ref_logp.exp() * torch.log_softmax(leaf, -1)).sum()).backward()  # grad of KL(ref || pi)
    assert torch.allclose(got, leaf.grad, atol=1e-5)
    assert not torch.allclose(got, reverse_kl_gradient(logits, ref_logp), atol=1e-3)


def test_k3_clamp_bounds_the_value_not_the_gradient():
    """Far below the reference k3 is clamped; the token is still pulled up, by log(pi / ref)."""
    logp = torch.tensor([-9.0, -0.1], requires_grad=True)
    ref = torch.tensor([-0.1, -0.1])
    kl = ratio_weighted(kl_estimate(logp, ref), logp, logp.detach(), ref)
    kl.sum().backward()
    assert kl[0] == K3_OUTPUT_CLAMP
    assert logp.grad.tolist() == pytest.approx([-8.9, 0.0])


@pytest.mark.parametrize("corrected", [True, False])
def test_the_loss_uses_the_setting(corrected):
    """micro_batch_loss with zero advantages: d loss / d logp is beta x log(pi / ref) per token (mean
    over tokens and sequences) when corrected, beta x (1 - ref / pi) when not."""
    logp = torch.tensor([[-0.2, -1.5, -0.7], [-2.0, -0.1, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    cfg = AlgorithmConfig(beta=0.5, kl_bias_correction=corrected)
    mb = MicroBatch(slice(0, 2), torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4), 1, mask, None)
    prepared = PreparedBatch(
        micro_batches=[mb],
        advantages=torch.zeros(2),
        normalizer=torch.tensor(2.0),
        max_new_tokens=3,
        reference=TokenLogProbs(ref, None, torch.ones(2, 3, dtype=torch.bool)),
        old=None,
    )
    finite = torch.ones(2, 3, dtype=torch.bool)
    micro_batch_loss(TokenLogProbs(logp, None, finite), mb, prepared, cfg).loss.backward()
    d = (logp - ref).detach()
    per_token = d if corrected else 1 - torch.exp(-d)
    want = 0.5 * per_token * mask / mask.sum(dim=1, keepdim=True) / 2
    assert torch.allclose(logp.grad, want, atol=1e-6)
