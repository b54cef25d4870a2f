"""Output head + chosen-token log-probs as one autograd function, a chunk of rows at a time.

Why not activation checkpointing of each chunk (what :func:`lm_head_log_probs` did before)?
Autograd keeps every intermediate of ``log_softmax(h @ W.T)[target]`` alive in the
backward: the logits, the ``where`` that zeroes non-finite rows, the exponentials inside
``logsumexp``, the scattered gradient of ``gather`` and the sum of the two gradients, each a
[rows, vocab] float32 tensor. On SmolLM2 (49k vocabulary) at 512 rows that is 100 MB apiece,
and those short-lived blocks are most of a LoRA step's memory above the weights.

Here the forward keeps only ``logsumexp`` per row (4 bytes) and the backward rebuilds one
chunk's logits and turns them into their gradient in place::

    d logp_i / d z_i = onehot(y_i) - softmax(z_i)          (z = h W^T / temperature)
    dh = (dz / temperature) W,  dW = (dz / temperature)^T h,  db = sum of dz / temperature

so one [rows, vocab] block exists at a time in each direction (on a CPU the entropy
diagnostic's temporaries are made a few rows at a time). On a GPU with Triton, the softmax
work on each block is one kernel per direction (:mod:`grpo_lightning.algorithm.head_kernels`)
over the logits in their own 16-bit dtype, and ``dz`` stays 16-bit for the two matmuls after it. The matmuls are those of checkpointing: one in the forward, the
recomputed logits plus ``dh`` (and ``dW`` when the head trains) in the backward.

A row whose logits are not all finite gets log-prob 0, ``finite=False`` and no gradient,
exactly as :func:`grpo_lightning.algorithm.logprobs.selective_log_probs` treats it (F3).

The head-weight gradient ``dW`` accumulates in float32 over the chunks. With 16-bit weights
(or a 16-bit autocast) on a GPU it runs on TF32 tensor cores (:func:`tf32_weight_gradient`):
the 16-bit weights round ``dW`` more coarsely at the end (autocast's matmuls would compute it
in 16 bits) than TF32 rounds ``dz``, and a 16-bit ``h`` is exact in TF32. In IEEE float32
that one matmul ran on the CUDA cores and took about a sixth of the training phase on a
Qwen2-0.5B-shaped model (152k vocabulary).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

import grpo_lightning.algorithm.head_kernels as head_kernels

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)
# The entropy's temporaries (two of them) per block of rows on a CPU; see entropy_block_rows.
ENTROPY_BLOCK_BYTES = 8 << 20


def tf32_is_lossless(weight_dtype: torch.dtype, device_type: str, autocast_dtype: torch.dtype | None = None) -> bool:
    """TF32 for the float32 ``dW`` accumulation loses nothing a 16-bit result keeps (see the module doc).

    ``autocast_dtype``: the autocast dtype the forward ran under, None without autocast.
    """
    return device_type == "cuda" and (weight_dtype in _SIXTEEN_BIT or autocast_dtype in _SIXTEEN_BIT)


@contextmanager
def tf32_weight_gradient(enabled: bool):
    """CUDA float32 matmuls on TF32 tensor cores inside the block, the user's setting restored after."""
    if not enabled:
        yield
        return
    matmul = torch.backends.cuda.matmul
    # torch >= 2.9 has fp32_precision, and its legacy allow_tf32 flag must not be mixed in.
    name, tf32 = ("fp32_precision", "tf32") if hasattr(matmul, "fp32_precision") else ("allow_tf32", True)
    previous = getattr(matmul, name)
    setattr(matmul, name, tf32)
    try:
        yield
    finally:
        setattr(matmul, name, previous)


def _logits_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear(hidden, weight)`` returns here (an autocast's, if one is on)."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


# Whether torch.addmm takes out_dtype here (16-bit operands, float32 result; CUDA, torch >= 2.8).
_ADDMM_OUT_DTYPE = {"works": True}


def _add_weight_gradient(grad_weight: torch.Tensor, dz: torch.Tensor, hidden: torch.Tensor, tf32: bool) -> torch.Tensor:
    """``grad_weight + dz^T hidden``, accumulated in ``grad_weight``'s float32 (or float64).

    16-bit ``dz`` and ``hidden`` (the kernels' path) multiply on the 16-bit tensor cores with a
    float32 result: no float32 copy of ``dz``; otherwise both are promoted (TF32 when lossless).
    """
    sixteen = dz.dtype == hidden.dtype and dz.dtype in _SIXTEEN_BIT and grad_weight.dtype == torch.float32
    if sixteen and dz.is_cuda and _ADDMM_OUT_DTYPE["works"]:
        try:
            return torch.addmm(grad_weight, dz.t(), hidden, out_dtype=torch.float32)
        except (RuntimeError, TypeError):  # an older torch: the promoted product below
            _ADDMM_OUT_DTYPE["works"] = False
    with tf32_weight_gradient(tf32):
        return grad_weight.addmm_(dz.t().to(grad_weight.dtype), hidden.to(grad_weight.dtype))


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 (float64 for float64 weights) logits of one chunk, non-finite rows zeroed, and which rows were finite."""
    z = F.linear(hidden, weight, bias).to(torch.promote_types(weight.dtype, torch.float32))
    if temperature != 1.0:
        z.div_(temperature)
    # A row sum is finite when every entry is, barring float32 overflow of ~1e38 logits: the
    # cheap test first, the exact one only for a chunk that fails it.
    row_ok = torch.isfinite(z.sum(dim=-1))
    if not bool(row_ok.all()):
        row_ok = torch.isfinite(z).all(dim=-1)
        z[~row_ok] = 0.0
    return z, row_ok


def entropy_block_rows(rows: int, vocab: int, element_size: int, device_type: str) -> int:
    """Rows of a chunk whose entropy temporaries exist at once.

    On a CPU ``ENTROPY_BLOCK_BYTES`` of rows: two more chunk-sized blocks were most of a LoRA
    step's memory above the weights. On a GPU the whole chunk: there a block of a few rows (13
    of a 152k vocabulary) made thousands of tiny kernels whose launches the GPU waited for, and
    the chunk's own size (``algorithm.logprob_chunk_mb``) already bounds the memory.
    """
    if device_type != "cpu":
        return max(1, rows)
    return max(1, ENTROPY_BLOCK_BYTES // (element_size * vocab))


def _entropy_rows(z: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of ``z`` (already ``z - max``) into ``out``; returns the rows' ``sum(exp(z))``.

    H = log s - sum(e * z) / s, with e = exp(z), s = sum(e). ``e`` and the product ``e * z``
    are [rows, vocab] temporaries, made :func:`entropy_block_rows` rows at a time. Each row's
    arithmetic is the same whatever the block.
    """
    rows, vocab = z.shape
    total = z.new_empty(rows)
    step = entropy_block_rows(rows, vocab, z.element_size(), z.device.type)
    for start in range(0, rows, step):
        block = z[start : start + step]
        e = block.exp()
        s = e.sum(dim=-1)
        total[start : start + step] = s
        out[start : start + step] = s.log() - torch.linalg.vecdot(e, block) / s
    return total


class FusedHeadLogProbs(torch.autograd.Function):
    """``log softmax(F.linear(hidden, weight, bias) / temperature)[targets]`` for [N, H] rows.

    Returns (logp [N], finite [N] bool, entropy [N] or an empty tensor); only ``logp``
    carries a gradient (the entropy is a diagnostic here; the entropy bonus takes the
    checkpointed path in :func:`lm_head_log_probs`). ``kernels``: let a GPU's chunks go through
    :mod:`grpo_lightning.algorithm.head_kernels` (one pass over the logits per direction).
    """

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, targets, temperature: float, chunk_rows: int, with_entropy: bool, kernels=True
    ):
        with torch.profiler.record_function("fused_head.forward"):  # a profile's table names the head's share
            return FusedHeadLogProbs._forward(
                ctx, hidden, weight, bias, targets, temperature, chunk_rows, with_entropy, kernels
            )

    @staticmethod
    def _forward(ctx, hidden, weight, bias, targets, temperature: float, chunk_rows: int, with_entropy: bool, kernels):
        rows, dtype = hidden.shape[0], torch.promote_types(weight.dtype, torch.float32)
        kernels = kernels and head_kernels.usable(hidden.device, _logits_dtype(hidden, weight))
        logp = hidden.new_empty(rows, dtype=dtype)
        lse = hidden.new_empty(rows, dtype=dtype)
        finite = torch.empty(rows, dtype=torch.bool, device=hidden.device)
        entropy = hidden.new_empty(rows if with_entropy else 0, dtype=dtype)
        for start in range(0, rows, chunk_rows):
            end = min(start + chunk_rows, rows)
            if kernels:  # the raw logits read once, in their own dtype (checked once per process)
                raw = F.linear(hidden[start:end], weight, bias)
                kernels = head_kernels.kernels_agree(raw, targets[start:end], temperature)
            if kernels:
                stats = head_kernels.row_stats(raw, targets[start:end], temperature, with_entropy)
                logp[start:end], lse[start:end], finite[start:end] = stats[0], stats[1], stats[3]
                if with_entropy:
                    entropy[start:end] = stats[2]
                continue
            z, row_ok = _chunk_logits(hidden[start:end], weight, bias, temperature)
            chosen = z.gather(-1, targets[start:end, None]).squeeze(-1)
            peak = z.amax(dim=-1, keepdim=True)
            z.sub_(peak)  # z - max: exp cannot overflow
            if with_entropy:
                total = _entropy_rows(z, entropy[start:end])
            else:
                total = z.exp_().sum(dim=-1)
            row_lse = total.log() + peak.squeeze(-1)
            lse[start:end] = row_lse
            chosen_logp = chosen - row_lse
            ok = row_ok & torch.isfinite(chosen_logp)
            logp[start:end] = torch.where(ok, chosen_logp, 0.0)
            finite[start:end] = ok
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, lse, finite)
        ctx.temperature, ctx.chunk_rows, ctx.kernels = temperature, chunk_rows, kernels
        device = hidden.device.type
        ctx.autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.mark_non_differentiable(finite, entropy)
        return logp, finite, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_finite, _grad_entropy):
        with torch.profiler.record_function("fused_head.backward"):
            return FusedHeadLogProbs._backward(ctx, grad_logp)

    @staticmethod
    def _backward(ctx, grad_logp):
        hidden, weight, bias, targets, lse, finite = ctx.saved_tensors
        temperature, chunk_rows = ctx.temperature, ctx.chunk_rows
        autocast_on, autocast_dtype = ctx.autocast  # the recomputed logits must be the forward's
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        dtype = lse.dtype
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=dtype, device=bias.device) if need_bias else None
        # A poisoned row (non-finite logits or log-prob) gets no gradient, whatever the upstream.
        grad_rows = torch.where(finite, grad_logp.to(dtype), 0.0) / temperature
        tf32 = tf32_is_lossless(weight.dtype, weight.device.type, autocast_dtype if autocast_on else None)
        for start in range(0, hidden.shape[0], chunk_rows):
            end = min(start + chunk_rows, hidden.shape[0])
            with torch.autocast(hidden.device.type, dtype=autocast_dtype, enabled=autocast_on):
                if ctx.kernels:  # dz in the logits' own dtype, written over them
                    raw = F.linear(hidden[start:end], weight, bias)
                    dz = head_kernels.logit_gradient_(
                        raw, targets[start:end], lse[start:end], grad_rows[start:end], temperature
                    )
                else:  # dz = g * (onehot(y) - softmax(z)), built in place over the float32 logits
                    z, _ = _chunk_logits(hidden[start:end], weight, bias, temperature)
                    g = grad_rows[start:end, None]
                    dz = z.sub_(lse[start:end, None]).exp_().mul_(-g)
                    dz.scatter_add_(-1, targets[start:end, None], g)
                    del z
            if need_weight:  # a poisoned row's dz is 0, but 0 x NaN is NaN: leave its hidden state out
                rows_ok = finite[start:end, None]
                grad_weight = _add_weight_gradient(grad_weight, dz, torch.where(rows_ok, hidden[start:end], 0), tf32)
            if need_bias:
                grad_bias += dz.sum(dim=0, dtype=dtype)
            if need_hidden:
                grad_hidden[start:end] = dz.to(weight.dtype) @ weight
            del dz
        if need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        if need_bias:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def fused_head_log_probs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    temperature: float,
    chunk_rows: int,
    with_entropy: bool,
    kernels: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logp, finite, entropy or None) of flat [N, H] ``hidden`` through ``head``; see the module doc."""
    logp, finite, entropy = FusedHeadLogProbs.apply(
        hidden, head.weight, head.bias, targets, float(temperature), max(1, int(chunk_rows)), with_entropy, kernels
    )
    return logp, finite, entropy if with_entropy else None
