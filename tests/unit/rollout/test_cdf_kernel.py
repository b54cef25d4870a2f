"""The sampler's Triton inverse-CDF kernel: the eager path's tokens, and when a draw may use it.

The kernel runs on GPUs; here it runs in Triton's CPU interpreter in a process of its own
(TRITON_INTERPRET must be set before Triton is imported), over random cases
(tests/helpers/cdf_kernel_check.py). The dispatch tests stand a recording fake in for the kernel.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from helpers.triton_interpreter import run_check

from grpo_lightning.rollout import cdf_kernel, sampler
from grpo_lightning.rollout.engine import Sampling


def test_the_kernel_picks_the_eager_tokens_in_tritons_interpreter():
    run_check("cdf_kernel_check.py", 120)


def test_the_kernel_only_for_float32_cuda_log_probs():
    def log_probs(is_cuda, dtype):
        return SimpleNamespace(is_cuda=is_cuda, dtype=dtype)

    assert cdf_kernel.usable(log_probs(True, torch.float32)) == (cdf_kernel.tl is not None)
    assert not cdf_kernel.usable(log_probs(True, torch.float64))
    assert not cdf_kernel.usable(log_probs(False, torch.float32))


class FakeKernel:
    """Stands in for the kernel on CPU tensors: the eager tokens, shifted by ``shift``; counts calls."""

    def __init__(self, shift: int = 0):
        self.shift, self.calls = shift, 0

    def __call__(self, log_probs, uniforms):
        self.calls += 1
        tokens = sampler.inverse_cdf(log_probs.double().exp(), uniforms)
        return (tokens + self.shift) % log_probs.shape[-1]


@pytest.fixture
def fake(monkeypatch):
    """The kernel as usable on CPU tensors, no verdict yet, and no CUDA graph being recorded."""
    monkeypatch.setattr(cdf_kernel, "usable", lambda log_probs: True)
    monkeypatch.setattr(cdf_kernel, "_AGREED", {})
    monkeypatch.setattr(sampler, "_capturing", lambda: False)

    def install(shift: int = 0) -> FakeKernel:
        kernel = FakeKernel(shift)
        monkeypatch.setattr(cdf_kernel, "inverse_cdf_from_log_probs", kernel)
        return kernel

    return install


def draws(count: int, rows: int = 6, vocab: int = 50, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sampling = Sampling(max_new_tokens=4, temperature=1.0, top_k=0, top_p=1.0)
    return [
        sampler.draw_tokens(
            torch.randn(rows, vocab, generator=g) * 3, sampling, torch.rand(rows, generator=g, dtype=torch.float64)
        )[0]
        for _ in range(count)
    ]


def test_the_first_draw_checks_the_kernel_then_the_kernel_draws(fake):
    kernel = fake()
    draws(1)
    assert kernel.calls == 1 and cdf_kernel.checked(torch.device("cpu")) is True  # the check
    draws(4)
    assert kernel.calls == 5  # then one call per draw


def test_a_kernel_that_picks_other_tokens_warns_once_and_is_not_used_again(fake):
    kernel = fake(shift=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = draws(4)
    assert len([w for w in caught if "inverse-CDF kernel" in str(w.message)]) == 1
    assert kernel.calls == 1  # the check only
    assert cdf_kernel.checked(torch.device("cpu")) is False
    eager = FakeKernel()
    g = torch.Generator().manual_seed(0)
    for tokens in got:  # the eager path's tokens, not the shifted ones
        logits, uniforms = torch.randn(6, 50, generator=g) * 3, torch.rand(6, generator=g, dtype=torch.float64)
        assert torch.equal(tokens, eager(torch.log_softmax(logits, -1), uniforms)[:, 0])


def test_a_draw_recorded_before_the_check_takes_the_eager_path(fake, monkeypatch):
    kernel = fake()
    monkeypatch.setattr(sampler, "_capturing", lambda: True)
    draws(3)
    assert kernel.calls == 0
    assert cdf_kernel.checked(torch.device("cpu")) is None


def test_rows_of_nan_log_probs_do_not_fail_the_check(fake):
    fake(shift=0)
    log_probs = torch.log_softmax(torch.randn(4, 30), -1)
    log_probs[2] = float("nan")  # a poisoned row: no right token
    uniforms = torch.rand(4, dtype=torch.float64)
    want = sampler.inverse_cdf(log_probs.double().exp(), uniforms)
    want[2] = (want[2] + 7) % 30  # whatever the kernel picks for it
    assert cdf_kernel.kernel_agrees(log_probs, uniforms, want)
