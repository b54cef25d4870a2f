"""The sampler's inverse CDF as one Triton kernel on GPUs (the tokens :func:`sampler.inverse_cdf` picks).

Why: at 256 rows of a 152k vocabulary one draw took 1.06 ms of an H200's time per decoded token
(benchmarks/results/LOG.md), most of it the float64 masses (a [B, V] float64 tensor written, then read
by the block sums) and the block-wise inverse CDF (sums, cumulative sums, searches, gathers).
Here one program per row reads the row's float32 log-probs twice and writes one token: a first
pass sums the float64 masses ``exp(logp)``, a second walks the blocks until their cumulative mass
reaches ``u`` times that total, then searches inside that block.

It picks the first token whose cumulative mass reaches ``u x total``, as :func:`inverse_cdf`
does, in the same float64 arithmetic summed in another order: the two can differ only where the
target falls within float64 rounding of a boundary between two tokens. A compiler or driver that
builds the kernel wrong must not bias every rollout silently, so its tokens are compared with
:func:`inverse_cdf`'s on the first eager draw per device (:func:`kernel_agrees`); a difference
warns once and the eager path draws from then on.

With ``TRITON_INTERPRET=1`` set before Triton is imported the kernel runs on CPU tensors in
Triton's interpreter: how the tests check it without a GPU.
"""

from __future__ import annotations

import functools
import warnings

import torch

try:
    import triton
    import triton.language as tl
except Exception:  # ImportError, or a Triton that cannot load on this platform: the eager path
    triton = tl = None

# Log-probs a program reads per step: a 152k row is 38 steps per pass.
BLOCK = 4096


def usable(log_probs: torch.Tensor) -> bool:
    """The kernel applies: float32 log-probs on a CUDA device and Triton installed."""
    return log_probs.is_cuda and log_probs.dtype == torch.float32 and tl is not None


# The kernel's body; :func:`_kernel` jits it (Triton reads its source and this module's ``tl``).
def _inverse_cdf_kernel(logp_ptr, stride, uniforms_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logp_ptr + row * stride
    lanes = tl.arange(0, BLOCK)
    total = tl.zeros([], tl.float64)
    for start in range(0, vocab, BLOCK):
        offs = start + lanes
        x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float64)
        total += tl.sum(tl.exp(x), axis=0)
    target = tl.load(uniforms_ptr + row).to(tl.float64) * total
    # The block the target falls in: the first whose cumulative mass reaches it, else the last.
    start = 0
    before = tl.zeros([], tl.float64)
    x = tl.load(base + lanes, mask=lanes < vocab, other=float("-inf")).to(tl.float64)
    mass = tl.sum(tl.exp(x), axis=0)
    while (before + mass < target) & (start + BLOCK < vocab):
        before += mass
        start += BLOCK
        offs = start + lanes
        x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float64)
        mass = tl.sum(tl.exp(x), axis=0)
    masses = tl.exp(x)
    cumulative = tl.cumsum(masses, axis=0)
    # The scan sums in another order than the block's total: where the target sits within
    # rounding of the block's end no lane may reach it; then the block's last token with mass.
    last = tl.max(tl.where(masses > 0, lanes, 0), axis=0)
    offset = tl.min(tl.where(cumulative >= target - before, lanes, last), axis=0)
    tl.store(out_ptr + row, tl.minimum(start + offset, vocab - 1).to(tl.int64))


@functools.cache
def _kernel():
    """The kernel, jitted at first use (after ``TRITON_INTERPRET`` is read: see the module's docstring)."""
    return triton.jit(_inverse_cdf_kernel)


def inverse_cdf_from_log_probs(log_probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[B, 1] int64: :func:`sampler.inverse_cdf` of ``log_probs.double().exp()`` for float32
    ``log_probs`` [B, V] (``-inf`` for filtered tokens) and ``uniforms`` [B], in one kernel."""
    if log_probs.stride(-1) != 1:
        log_probs = log_probs.contiguous()
    rows, vocab = log_probs.shape
    out = torch.empty(rows, 1, dtype=torch.int64, device=log_probs.device)
    if rows:
        _kernel()[(rows,)](log_probs, log_probs.stride(0), uniforms.contiguous(), out, vocab, BLOCK=BLOCK, num_warps=8)
    return out


# Per device: whether the kernel picked the eager path's tokens on its first eager draw.
_AGREED: dict[torch.device, bool] = {}


def kernel_agrees(log_probs: torch.Tensor, uniforms: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether the kernel's tokens equal ``want`` (the eager path's on the same draw): checked once per
    device, then remembered; a difference warns once."""
    if log_probs.device not in _AGREED:
        got = inverse_cdf_from_log_probs(log_probs, uniforms)
        # a row of NaN log-probs (poisoned logits) has no right token: the draw's fallback picks it
        valid = torch.isfinite(log_probs.amax(dim=-1))
        differ = int(((got != want)[:, 0] & valid).sum())
        _AGREED[log_probs.device] = differ == 0
        if differ:
            warnings.warn(
                f"the sampler's Triton inverse-CDF kernel picked other tokens than the eager path on {differ} "
                f"of {len(want)} rows on {log_probs.device}: the eager path draws from now on",
                stacklevel=3,
            )
    return _AGREED[log_probs.device]


def checked(device: torch.device) -> bool | None:
    """The first-use check's verdict on ``device``; None before it ran."""
    return _AGREED.get(device)
