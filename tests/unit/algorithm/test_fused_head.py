"""The fused output head + log-softmax: same values and gradients as plain autograd, less kept.

Property test over random shapes, chunkings, temperatures, biases, trainable or frozen
heads and poisoned rows, in float64 so that any difference is a bug, not rounding.
"""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.algorithm import fused_head, lm_head_log_probs
from grpo_lightning.algorithm.fused_head import (
    ENTROPY_BLOCK_BYTES,
    FusedHeadLogProbs,
    entropy_block_rows,
    fused_head_log_probs,
    tf32_is_lossless,
    tf32_weight_gradient,
)


def plain(hidden, head, targets, temperature):
    """The textbook computation: full logits, log_softmax, gather; a row with non-finite logits
    contributes nothing, to the log-probs or to any gradient (F3)."""
    with torch.no_grad():
        ok = torch.isfinite(head(hidden)).all(-1)
    z = head(torch.where(ok[:, None], hidden, 0)) / temperature
    z = torch.where(ok[:, None], z, torch.zeros_like(z))
    logp = torch.log_softmax(z, dim=-1)
    chosen = torch.where(ok, logp.gather(-1, targets[:, None]).squeeze(-1), torch.zeros(()))
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, ok, entropy


@pytest.mark.parametrize("case", range(60))
def test_values_and_gradients_match_plain_autograd(case):
    gen = torch.Generator().manual_seed(case)
    rows = int(torch.randint(1, 40, (), generator=gen))
    width, vocab = int(torch.randint(2, 12, (), generator=gen)), int(torch.randint(2, 70, (), generator=gen))
    chunk = int(torch.randint(1, rows + 3, (), generator=gen))
    temperature = float(torch.rand((), generator=gen)) * 1.5 + 0.3 if case % 3 else 1.0
    head = torch.nn.Linear(width, vocab, bias=bool(case % 2), dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=gen, dtype=torch.float64) * 2)
    head.weight.requires_grad_(case % 4 != 0)  # frozen head: LoRA's case
    hidden = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    poisoned = torch.rand(rows, generator=gen) < 0.15
    hidden[poisoned, 0] = float("nan") if case % 2 else float("inf")
    hidden.requires_grad_(True)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    upstream = torch.randn(rows, generator=gen, dtype=torch.float64)
    params = [hidden] + [p for p in head.parameters() if p.requires_grad]

    logp, finite, entropy = fused_head_log_probs(hidden, head, targets, temperature, chunk, with_entropy=True)
    got = torch.autograd.grad((logp * upstream).sum(), params)
    want_logp, want_ok, want_entropy = plain(hidden, head, targets, temperature)
    want = torch.autograd.grad((want_logp * upstream).sum(), params)

    # The rows whose logits this platform's matmul makes non-finite, the poisoned ones among them;
    # not ``~poisoned`` itself: which other rows a NaN reaches is the platform's (head_kernels_check.py).
    assert finite.tolist() == want_ok.tolist() and not finite[poisoned].any()
    torch.testing.assert_close(logp.double(), want_logp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy[finite].double(), want_entropy[want_ok], rtol=1e-6, atol=1e-6)
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()  # a poisoned row reaches no gradient
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_gradcheck_in_float64():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(9, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 9, (7,), generator=gen)
    fn = lambda h, w, b: FusedHeadLogProbs.apply(h, w, b, targets, 0.8, 3, False)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


def test_only_per_row_values_are_kept_for_the_backward():
    """What autograd holds between forward and backward: the inputs and O(rows), never [rows, vocab]."""
    rows, width, vocab = 64, 8, 1000
    head = torch.nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(2, rows // 2, width, requires_grad=True)
    targets = torch.randint(0, vocab, (2, rows // 2))
    kept: dict[int, int] = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = lm_head_log_probs(hidden, head, targets, chunk_size=16, with_entropy=True)
    inputs = hidden.numel() * 4 + head.weight.numel() * 4
    one_chunk_of_logits = 16 * vocab * 4
    assert sum(kept.values()) - inputs < one_chunk_of_logits / 4  # per-row lse, targets, flags
    out.logp.sum().backward()
    assert torch.isfinite(hidden.grad).all() and hidden.grad.abs().sum() > 0


def test_autocast_recomputes_the_forwards_logits():
    """Under bf16 autocast the backward rebuilds the logits the forward saw; else softmax != exp(z - lse)."""
    gen = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(16, 40, bias=False)
    hidden = torch.randn(10, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 40, (10,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _, _ = fused_head_log_probs(hidden, head, targets, 1.0, 4, with_entropy=False)
        z = head(hidden).float()
    want = torch.log_softmax(z, -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, want, rtol=0, atol=1e-5)
    upstream = torch.rand(10, generator=gen)
    (got,) = torch.autograd.grad((logp * upstream).sum(), hidden)
    (expected,) = torch.autograd.grad((want * upstream).sum(), hidden)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize(
    "weight, device, autocast, expected",
    [
        (torch.bfloat16, "cuda", None, True),
        (torch.float16, "cuda", None, True),
        (torch.float32, "cuda", torch.bfloat16, True),  # bf16-mixed: autocast's matmuls are 16-bit anyway
        (torch.float32, "cuda", None, False),  # full float32 training keeps IEEE float32
        (torch.float64, "cuda", None, False),
        (torch.bfloat16, "cpu", None, False),  # TF32 is a CUDA tensor-core format
    ],
)
def test_tf32_only_where_the_result_keeps_less_precision_than_tf32(weight, device, autocast, expected):
    assert tf32_is_lossless(weight, device, autocast) is expected


@pytest.mark.parametrize("user_setting", ["ieee", "tf32"])
def test_tf32_block_sets_tf32_inside_and_restores_the_users_setting(user_setting):
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = user_setting
        with tf32_weight_gradient(True):
            assert matmul.fp32_precision == "tf32"
        assert matmul.fp32_precision == user_setting
        with tf32_weight_gradient(False):
            assert matmul.fp32_precision == user_setting
        with pytest.raises(RuntimeError), tf32_weight_gradient(True):
            raise RuntimeError("the setting is restored on the way out of an error too")
        assert matmul.fp32_precision == user_setting
    finally:
        matmul.fp32_precision = before


@pytest.mark.parametrize("case", range(40))
def test_entropy_by_blocks_of_rows_is_bit_identical_to_the_whole_chunk(case, monkeypatch):
    """The entropy's temporaries are made a block of rows at a time: each row's arithmetic is the
    same, so the values must be equal bit for bit to the one-block computation, at any block size."""
    g = torch.Generator().manual_seed(case)
    rows, vocab = int(torch.randint(1, 200, (), generator=g)), int(torch.randint(2, 3000, (), generator=g))
    dtype = torch.float64 if case % 4 == 0 else torch.float32
    z = torch.randn(rows, vocab, generator=g, dtype=dtype) * float(torch.rand((), generator=g) * 30)
    z -= z.amax(dim=-1, keepdim=True)
    e = z.exp()
    total = e.sum(dim=-1)
    want = total.log() - torch.linalg.vecdot(e, z) / total
    monkeypatch.setattr(fused_head, "ENTROPY_BLOCK_BYTES", int(torch.randint(1, 4 * rows * vocab * 8, (), generator=g)))
    got = torch.empty(rows, dtype=dtype)
    got_total = fused_head._entropy_rows(z, got)
    assert torch.equal(got, want) and torch.equal(got_total, total)


def test_entropy_blocks_are_a_few_rows_on_a_cpu_and_the_whole_chunk_on_a_gpu():
    """On a GPU, 13-row blocks of a 152k vocabulary made thousands of tiny kernels per pass (an
    H200 profile: the policy forward 80-90 ms slower); on a CPU the blocks keep the memory down."""
    for rows, vocab in [(165, 151936), (1, 49152), (2000, 64), (300, 3000)]:
        assert entropy_block_rows(rows, vocab, 4, "cuda") == rows
        cpu = entropy_block_rows(rows, vocab, 4, "cpu")
        assert cpu == max(1, ENTROPY_BLOCK_BYTES // (4 * vocab))
        assert cpu * 4 * vocab <= ENTROPY_BLOCK_BYTES or cpu == 1
