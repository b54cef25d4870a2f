"""The output head's Triton kernels: the same log-probs, entropies and gradients as the eager path.

The kernels run on GPUs; here they run in Triton's CPU interpreter, in a process of its own
(TRITON_INTERPRET must be set before Triton is imported), over random cases
(tests/helpers/head_kernels_check.py).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.triton_interpreter import run_check

from grpo_lightning.algorithm import fused_head, head_kernels
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.step.module import GRPOModule


def test_kernels_match_the_eager_path_in_tritons_interpreter():
    run_check("head_kernels_check.py", 60)


def test_kernels_only_for_cuda_tensors_of_the_dtypes_they_read(monkeypatch):
    monkeypatch.setattr(head_kernels, "triton_installed", lambda: True)
    assert head_kernels.usable(torch.device("cuda", 0), torch.bfloat16)
    assert head_kernels.usable(torch.device("cuda", 0), torch.float32)
    assert not head_kernels.usable(torch.device("cuda", 0), torch.float64)
    assert not head_kernels.usable(torch.device("cpu"), torch.bfloat16)
    monkeypatch.setattr(head_kernels, "triton_installed", lambda: False)
    assert not head_kernels.usable(torch.device("cuda", 0), torch.bfloat16)


def test_a_cpu_never_calls_the_kernels(monkeypatch):
    """On a CPU the eager path runs, whatever ``kernels`` says (the interpreter is for tests only)."""

    def refuse(*_a, **_k):
        raise AssertionError("a kernel was called for CPU tensors")

    monkeypatch.setattr(head_kernels, "row_stats", refuse)
    monkeypatch.setattr(head_kernels, "logit_gradient_", refuse)
    head = torch.nn.Linear(8, 50)
    hidden = torch.randn(12, 8, requires_grad=True)
    logp, finite, _ = fused_head.fused_head_log_probs(hidden, head, torch.randint(0, 50, (12,)), 1.0, 5, False, True)
    logp.sum().backward()
    assert finite.all() and torch.isfinite(hidden.grad).all() and hidden.grad.abs().sum() > 0


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_weight_gradient_from_16_bit_operands_accumulates_in_float32(rows):
    """Off CUDA (or without addmm's out_dtype) the 16-bit dz and hidden states are promoted: the
    accumulation stays float32, and equals the float32 product of the same 16-bit values."""
    gen = torch.Generator().manual_seed(rows)
    dz = torch.randn(rows, 30, generator=gen).bfloat16()
    hidden = torch.randn(rows, 6, generator=gen).bfloat16()
    start = torch.randn(30, 6, generator=gen)
    got = fused_head._add_weight_gradient(start.clone(), dz, hidden, tf32=False)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, start + dz.float().t() @ hidden.float(), rtol=1e-6, atol=1e-6)


def _torch_row_stats(z, targets, temperature, with_entropy):
    """What the kernels compute, in plain torch (a stand-in that needs no Triton)."""
    x = z.float() / temperature
    finite = torch.isfinite(x).all(dim=-1)
    x = torch.where(finite[:, None], x, 0.0)
    lse = torch.logsumexp(x, dim=-1)
    logp = torch.where(finite, x.gather(-1, targets[:, None]).squeeze(-1) - lse, 0.0)
    entropy = lse - (torch.softmax(x, dim=-1) * x).sum(dim=-1)
    return logp, lse, entropy if with_entropy else entropy[:0], finite


def _torch_logit_gradient_(z, targets, lse, grad, temperature):
    dz = -grad[:, None] * torch.exp(z.float() / temperature - lse[:, None])
    dz[torch.arange(len(z)), targets] += grad
    return z.copy_(torch.where(grad[:, None] == 0, 0.0, dz))


def _stand_in_kernels(monkeypatch, *, logp_shift=0.0, grad_scale=1.0):
    """Kernels usable on CPU tensors, replaced by plain torch (optionally wrong); returns their call counts."""
    calls = {"row_stats": 0, "logit_gradient_": 0}

    def row_stats(z, targets, temperature, with_entropy):
        calls["row_stats"] += 1
        logp, lse, entropy, finite = _torch_row_stats(z, targets, temperature, with_entropy)
        return logp + logp_shift, lse, entropy, finite

    def logit_gradient_(z, targets, lse, grad, temperature):
        calls["logit_gradient_"] += 1
        return _torch_logit_gradient_(z, targets, lse, grad * grad_scale, temperature)

    monkeypatch.setattr(head_kernels, "usable", lambda device, dtype: True)
    monkeypatch.setattr(head_kernels, "row_stats", row_stats)
    monkeypatch.setattr(head_kernels, "logit_gradient_", logit_gradient_)
    monkeypatch.setattr(head_kernels, "_AGREED", {})
    return calls


def _head_pass(kernels=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(6, 90)
    with torch.no_grad():
        head.weight.copy_(torch.randn(90, 6, generator=gen))
        head.bias.copy_(torch.randn(90, generator=gen))
    hidden = torch.randn(150, 6, generator=gen, requires_grad=True)
    targets = torch.randint(0, 90, (150,), generator=gen)
    logp, finite, entropy = fused_head.fused_head_log_probs(hidden, head, targets, 0.8, 40, True, kernels)
    (logp * torch.linspace(-1, 1, 150)).sum().backward()
    return logp.detach(), entropy, hidden.grad, head.weight.grad


def test_agreeing_kernels_run_every_chunk_after_one_check(monkeypatch):
    want = _head_pass(kernels=False)
    calls = _stand_in_kernels(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _head_pass()
    assert calls == {"row_stats": 1 + 4, "logit_gradient_": 1 + 4}  # the check, then 4 chunks each way
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "wrong, message", [({"logp_shift": 0.01}, "log-probs differ"), ({"grad_scale": 1.05}, "logit gradients differ")]
)
def test_kernels_that_disagree_are_dropped_with_a_warning_and_the_eager_path_trains(monkeypatch, wrong, message):
    """A Triton or driver that builds the kernels wrong must not train on wrong log-probs or
    gradients silently: the check on the first chunk warns, and the eager path computes everything."""
    want = _head_pass(kernels=False)
    calls = _stand_in_kernels(monkeypatch, **wrong)
    with pytest.warns(UserWarning, match=f"Triton kernels .* disagree .*{message}.*algorithm.head_kernels=false"):
        got = _head_pass()
    assert calls == {"row_stats": 1, "logit_gradient_": 1}  # the check alone
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # decided once per process and dtype: no second warning
        _head_pass(seed=1)
    assert calls == {"row_stats": 1, "logit_gradient_": 1}


def test_head_kernels_false_never_calls_them(monkeypatch):
    calls = _stand_in_kernels(monkeypatch)
    _head_pass(kernels=False)
    assert calls == {"row_stats": 0, "logit_gradient_": 0}


@pytest.mark.parametrize("setting", [True, False])
def test_algorithm_head_kernels_reaches_the_head_from_the_log_prob_pass(monkeypatch, policy, setting):
    """``algorithm.head_kernels`` travels from the config through the log-prob pass to the head."""
    calls = _stand_in_kernels(monkeypatch)
    module = GRPOModule(policy, AlgorithmConfig(head_kernels=setting))
    vocab = policy.get_output_embeddings().out_features
    ids = torch.randint(0, vocab, (3, 10), generator=torch.Generator().manual_seed(0))
    out = module.forward_pass.padded(policy, ids, torch.ones_like(ids), 4, 1.0, with_entropy=True)
    assert torch.isfinite(out.logp).all()
    assert (calls["row_stats"] > 0) is setting
