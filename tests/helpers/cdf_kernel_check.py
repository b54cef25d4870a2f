"""The sampler's Triton inverse-CDF kernel against :func:`sampler.inverse_cdf`, in Triton's CPU interpreter.

Run by tests/unit/rollout/test_cdf_kernel.py in a process of its own with TRITON_INTERPRET=1
(Triton reads it at import). Random cases: vocabularies of one block, at the kernel's block
boundary and over several blocks; flat and peaked rows; filtered tokens (-inf); uniforms at 0, at
the largest double below 1 and random. Exits 1 with the failing case on a mismatch; prints
``checked N cases`` at the end.
"""

from __future__ import annotations

import sys

import torch

from grpo_lightning.rollout import cdf_kernel
from grpo_lightning.rollout.sampler import inverse_cdf


def check(case: int) -> None:
    gen = torch.Generator().manual_seed(case)
    rows = int(torch.randint(1, 10, (), generator=gen))
    block = cdf_kernel.BLOCK
    kind = case % 4
    if kind == 0:
        vocab = int(torch.randint(1, 400, (), generator=gen))
    elif kind == 1:
        vocab = block + int(torch.randint(-2, 3, (), generator=gen))
    else:
        vocab = int(torch.randint(block + 3, 3 * block + 500, (), generator=gen))
    scale = float(torch.rand((), generator=gen)) * 30  # 0: flat rows; 30: nearly one token
    z = torch.randn(rows, vocab, generator=gen) * scale
    filtered = torch.rand(rows, vocab, generator=gen) < float(torch.rand((), generator=gen))
    filtered[torch.arange(rows), torch.randint(0, vocab, (rows,), generator=gen)] = False  # one token stays
    z[filtered] = float("-inf")
    log_probs = torch.log_softmax(z, dim=-1)
    uniforms = torch.rand(rows, generator=gen, dtype=torch.float64)
    uniforms[0] = 0.0
    if rows > 1:
        uniforms[1] = 1.0 - 2.0**-53
    got = cdf_kernel.inverse_cdf_from_log_probs(log_probs, uniforms)
    want = inverse_cdf(log_probs.double().exp(), uniforms)
    label = f"case {case}: {rows} rows, vocab {vocab}, scale {scale:.1f}"
    assert got.shape == want.shape == (rows, 1) and got.dtype == torch.int64, label
    message = f"{label}: kernel {got[:, 0].tolist()} eager {want[:, 0].tolist()}"
    # Row 1's target is within float64 rounding of the row's total, where the summation order
    # decides: the two paths may pick different tokens there, but only across a stretch of tail
    # tokens whose masses together are below that rounding, and the kernel's pick has mass (the
    # eager path may overshoot onto a filtered token, which the draw replaces with the argmax).
    exact = torch.ones(rows, dtype=torch.bool)
    if rows > 1:
        exact[1] = False
        masses = log_probs[1].double().exp()
        low, high = sorted((int(got[1]), int(want[1])))
        assert masses[int(got[1])] > 0, message
        assert masses[low + 1 : high + 1].sum() <= 1e-12 * masses.sum(), message
    assert torch.equal(got[exact], want[exact]), message


def main() -> None:
    count = int(sys.argv[1])
    for case in range(count):
        try:
            check(case)
        except AssertionError as err:
            print(err)
            sys.exit(1)
    print(f"checked {count} cases")


if __name__ == "__main__":
    main()
