"""The output head's Triton kernels: the same log-probs, entropies and gradients as the eager path.

The kernels run on GPUs; here they run in Triton's CPU interpreter, in a process of its own
(TRITON_INTERPRET must be set before Triton is imported), over random cases
(tests/helpers/head_kernels_check.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_lightning.algorithm import fused_head, head_kernels

HELPER = Path(__file__).resolve().parents[2] / "helpers" / "head_kernels_check.py"
ROOT = HELPER.parents[2]


def test_kernels_match_the_eager_path_in_tritons_interpreter():
    # Triton 3.6's interpreter stops on these kernels ("only 0-dimensional arrays can be converted
    # to Python scalars", seen on a GPU machine); 3.9's (this project's venv, through vLLM) runs them.
    pytest.importorskip("triton", minversion="3.9")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(HELPER), "60"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.strip().endswith("checked 60 cases")


def test_kernels_only_for_cuda_tensors_of_the_dtypes_they_read(monkeypatch):
    monkeypatch.setattr(head_kernels, "tl", object())  # as if Triton were installed
    assert head_kernels.usable(torch.device("cuda", 0), torch.bfloat16)
    assert head_kernels.usable(torch.device("cuda", 0), torch.float32)
    assert not head_kernels.usable(torch.device("cuda", 0), torch.float64)
    assert not head_kernels.usable(torch.device("cpu"), torch.bfloat16)
    monkeypatch.setattr(head_kernels, "tl", None)
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
