"""The fused head through its Triton kernels against its eager path, in Triton's CPU interpreter.

Run by tests/unit/algorithm/test_head_kernels.py in a process of its own with TRITON_INTERPRET=1
(Triton reads it at import). Random cases: shapes (vocabularies across the kernels' blocks),
chunkings, temperatures, biases, frozen heads, poisoned rows, float32 and bfloat16; a few again
under a ``linear`` that spreads NaN into neighbouring rows, as some CPUs' matmuls do. Exits 1 with
the failing case on a mismatch; prints ``checked N cases`` at the end.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.nn.functional as F

from grpo_lightning.algorithm import fused_head, head_kernels


def grads(hidden, head, targets, temperature, chunk, upstream, kernels):
    h = hidden.detach().clone().requires_grad_(True)
    params = [h] + [p for p in head.parameters() if p.requires_grad]
    logp, finite, entropy = fused_head.fused_head_log_probs(
        h, head, targets, temperature, chunk, with_entropy=True, kernels=kernels
    )
    return logp, finite, entropy, torch.autograd.grad((logp * upstream).sum(), params)


def finite_logit_rows(hidden, head, chunk):
    """Rows whose logits this platform's ``linear`` makes all finite, a chunk of rows per call as the head
    computes them: what the head's ``finite`` must say. Not ``~poisoned``: a CPU's bfloat16 matmul may
    write NaN into rows beside a NaN row (torch 2.13, oneDNN with AMX, an odd inner dimension), and
    which rows it reaches is the platform's choice, not the head's."""
    with torch.no_grad():
        blocks = [F.linear(hidden[s : s + chunk], head.weight, head.bias) for s in range(0, len(hidden), chunk)]
    return torch.isfinite(torch.cat(blocks)).all(dim=-1)


@contextlib.contextmanager
def nan_spreading_linear():
    """``F.linear`` as a CPU kind computes it that writes NaN into the rows beside a non-finite row
    (what torch 2.13's bfloat16 matmul did on an Intel Xeon with AMX): the check must hold there too."""
    linear = F.linear

    def spreading(x, weight, bias=None):
        z = linear(x, weight, bias)
        bad = ~torch.isfinite(z).all(dim=-1)
        beside = torch.zeros_like(bad)
        beside[1:] |= bad[:-1]
        beside[:-1] |= bad[1:]
        return z.masked_fill((beside & ~bad)[:, None], float("nan"))

    F.linear = spreading
    try:
        yield
    finally:
        F.linear = linear


def check(case: int) -> None:
    gen = torch.Generator().manual_seed(case)
    dtype = torch.bfloat16 if case % 3 == 0 else torch.float32
    rows = int(torch.randint(1, 24, (), generator=gen))
    width = int(torch.randint(2, 10, (), generator=gen))
    big = case % 5 == 0  # more than one block of the kernels per row
    vocab = int(torch.randint(4097, 6000, (), generator=gen)) if big else int(torch.randint(2, 300, (), generator=gen))
    chunk = int(torch.randint(1, rows + 3, (), generator=gen))
    temperature = float(torch.rand((), generator=gen)) * 1.5 + 0.3 if case % 2 else 1.0
    head = torch.nn.Linear(width, vocab, bias=case % 4 == 1, dtype=dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=gen) * 2)
        if head.bias is not None:
            head.bias.copy_(torch.randn(vocab, generator=gen))
    head.weight.requires_grad_(case % 4 != 0)
    hidden = torch.randn(rows, width, generator=gen).to(dtype)
    poisoned = torch.rand(rows, generator=gen) < 0.2
    hidden[poisoned, 0] = float("nan") if case % 2 else float("inf")
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    upstream = torch.randn(rows, generator=gen)

    got = grads(hidden, head, targets, temperature, chunk, upstream, kernels=True)
    want = grads(hidden, head, targets, temperature, chunk, upstream, kernels=False)
    label = f"case {case}: {rows} rows, vocab {vocab}, chunk {chunk}, T={temperature:.3f}, {dtype}"
    expected = finite_logit_rows(hidden, head, chunk)
    assert not expected[poisoned].any(), f"{label}: a poisoned row's logits came out finite"
    assert got[1].tolist() == want[1].tolist() == expected.tolist(), label
    tol = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got[0], want[0], **tol, msg=lambda m: f"{label}: logp {m}")
    torch.testing.assert_close(got[2], want[2], **tol, msg=lambda m: f"{label}: entropy {m}")
    for g, w in zip(got[3], want[3], strict=True):
        assert torch.isfinite(g).all(), f"{label}: a poisoned row reached a gradient"
        if dtype == torch.float32:  # the same arithmetic up to summation order
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"{label}: gradient {m}")
        else:  # dz rounded to bf16 before the matmuls (the eager path keeps float32): its 2^-9,
            # grown where a sum over rows cancels (a bias's gradient over a few tokens)
            error = float((g.float() - w.float()).norm() / w.float().norm().clamp_min(1e-12))
            assert error < 3e-2, f"{label}: gradient relative error {error:.2e}"


def main() -> None:
    torch.set_num_threads(1)  # oneDNN's bf16 matmuls can split their sums differently run to run
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    head_kernels.usable = lambda device, dtype: dtype in head_kernels._KERNEL_DTYPES  # CPU tensors too
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    for case in range(cases):
        check(case)
    with nan_spreading_linear():
        for case in range(min(cases, 12)):
            check(case)
    for dtype in (torch.float32, torch.bfloat16):  # the first-use check: no false alarm on hard rows
        gen = torch.Generator().manual_seed(1)
        z = (torch.randn(64, 5000, generator=gen) * 40).to(dtype)  # large logits
        z[:8, 7] = z[:8].float().amax(dim=-1).to(dtype) + 15  # probability ~1 - 3e-7: g - g p cancels
        targets = torch.randint(0, 5000, (64,), generator=gen)
        targets[:4] = 7
        z[9, 3] = float("nan")
        problem = head_kernels._disagreement(z, targets, 0.9)
        assert problem is None, f"{dtype}: the check rejects correct kernels: {problem}"
    # the kernels ran: their first-use check agreed for both dtypes (else the eager path ran twice)
    agreed = {str(dtype): ok for (_, dtype), ok in head_kernels._AGREED.items()}
    assert agreed == {"torch.float32": True, "torch.bfloat16": True}, agreed
    print(f"checked {cases} cases")


if __name__ == "__main__":
    main()
