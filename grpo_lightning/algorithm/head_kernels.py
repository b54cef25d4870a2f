"""Triton kernels for the fused head's softmax work: one pass over a chunk's logits per direction.

Why: on a GPU the eager path of :mod:`grpo_lightning.algorithm.fused_head` turned each chunk's
16-bit logits into float32 and ran about ten elementwise and reduction passes over them per
direction (cast, finiteness, max, subtract, exp, sums, the gradient's exp and scale): on a
Qwen2-0.5B-shaped model (152k vocabulary) about 130 ms of an H200's kernel time per step against
107 ms of bf16 matmuls. Here each row is read once, in its own dtype, with float32 arithmetic:

- :func:`row_stats` (forward): an online log-sum-exp (each lane keeps its own running maximum, sum
  of exponentials and, for the entropy, sum of ``exp(z - max) * (z - max)``), the finiteness test
  and the chosen token's logit, in one read of the row;
- :func:`logit_gradient_` (backward): ``dz = g * (onehot(y) - exp(z - lse))`` written over the
  logits in place, in their dtype, so the two matmuls after it read 16-bit operands.

The rows' results are those of the eager path up to float32 rounding (another summation order);
a poisoned row (a non-finite logit or log-prob) gets what the eager path gives it: log-prob 0,
``finite=False``, the log-sum-exp and entropy of an all-zero row (log V), and a zero gradient.

With ``TRITON_INTERPRET=1`` in the environment before Triton is imported, the kernels run on CPU
tensors in Triton's interpreter (numpy, slow): that is how the tests check them without a GPU.
:func:`usable` says whether the fast path applies.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

try:
    import triton
    import triton.language as tl
except Exception:  # ImportError, or a Triton that cannot load on this platform: the eager path
    triton = tl = None

# Lanes per program: a row of V logits is read in ceil(V / BLOCK) steps.
FORWARD_BLOCK = 2048
BACKWARD_BLOCK = 4096
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def triton_installed() -> bool:
    return tl is not None


def usable(logits_device: torch.device, logits_dtype: torch.dtype) -> bool:
    """The kernels run here at GPU speed: a CUDA tensor of a dtype they read, and Triton installed."""
    return logits_device.type == "cuda" and logits_dtype in _KERNEL_DTYPES and triton_installed()


# The kernels' bodies; :func:`_kernels` jits them (Triton reads their source and this module's ``tl``).
def _row_stats_kernel(
    z_ptr,
    z_stride,
    targets_ptr,
    logp_ptr,
    lse_ptr,
    entropy_ptr,
    finite_ptr,
    vocab,
    inv_temperature,
    log_vocab,
    WITH_ENTROPY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * z_stride
    lanes = tl.arange(0, BLOCK)
    peak = tl.full([BLOCK], float("-inf"), tl.float32)  # each lane's running maximum
    total = tl.zeros([BLOCK], tl.float32)  # sum of exp(x - peak)
    weighted = tl.zeros([BLOCK], tl.float32)  # sum of exp(x - peak) * (x - peak): no cancellation
    bad = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + lanes
        inside = offs < vocab
        x = tl.load(base + offs, mask=inside, other=0.0).to(tl.float32) * inv_temperature
        bad = bad | ((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32)
        x = tl.where(inside, x, float("-inf"))
        new_peak = tl.maximum(peak, x)
        seen = new_peak > float("-inf")  # a lane with no logit yet keeps zeros
        shift = tl.where(seen & inside, x - new_peak, 0.0)
        e = tl.where(seen & inside, tl.exp(shift), 0.0)
        drop = tl.where(peak > float("-inf"), peak - new_peak, 0.0)  # a lane's first logit: sums are 0
        if WITH_ENTROPY:  # re-centre the lane's sum on its new peak, then add this step
            weighted = tl.exp(drop) * (weighted + total * drop) + e * shift
        total = total * tl.exp(drop) + e
        peak = new_peak
    row_peak = tl.max(peak, axis=0)
    lane_scale = tl.where(peak > float("-inf"), tl.exp(peak - row_peak), 0.0)
    row_total = tl.sum(total * lane_scale, axis=0)
    lse = row_peak + tl.log(row_total)
    target = tl.load(targets_ptr + row).to(tl.int64)
    chosen = tl.load(base + target).to(tl.float32) * inv_temperature
    logp = chosen - lse
    finite_logits = tl.sum(bad, axis=0) == 0
    ok = finite_logits & (logp == logp) & (tl.abs(logp) != float("inf"))
    tl.store(logp_ptr + row, tl.where(ok, logp, 0.0))
    # A row with a non-finite logit is scored as the eager path scores it: as all zeros.
    tl.store(lse_ptr + row, tl.where(finite_logits, lse, log_vocab))
    tl.store(finite_ptr + row, ok.to(tl.int8))
    if WITH_ENTROPY:
        # sum over lanes of exp(x - row_peak) * (x - row_peak), each lane's sum moved to the row's peak
        lane_drop = tl.where(peak > float("-inf"), peak - row_peak, 0.0)
        centred = tl.sum(lane_scale * (weighted + total * lane_drop), axis=0)
        entropy = tl.log(row_total) - centred / row_total
        tl.store(entropy_ptr + row, tl.where(finite_logits, entropy, log_vocab))


def _logit_gradient_kernel(
    z_ptr,
    z_stride,
    targets_ptr,
    lse_ptr,
    grad_ptr,
    vocab,
    inv_temperature,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * z_stride
    g = tl.load(grad_ptr + row)  # d loss / d logp, already / temperature, 0 for a poisoned row
    lse = tl.load(lse_ptr + row)
    target = tl.load(targets_ptr + row).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    for start in range(0, vocab, BLOCK):
        offs = start + lanes
        inside = offs < vocab
        x = tl.load(base + offs, mask=inside, other=0.0).to(tl.float32) * inv_temperature
        dz = tl.where(offs == target, g, 0.0) - g * tl.exp(x - lse)
        dz = tl.where(g == 0.0, 0.0, dz)  # 0 x a non-finite logit would be NaN
        tl.store(base + offs, dz.to(z_ptr.dtype.element_ty), mask=inside)


@functools.cache
def _kernels():
    """The two kernels, jitted on first use (with ``TRITON_INTERPRET=1`` set before Triton's import,
    for its CPU interpreter: how the tests run them without a GPU)."""
    return triton.jit(_row_stats_kernel), triton.jit(_logit_gradient_kernel)


def _block(vocab: int, cap: int) -> int:
    return min(cap, 1 << max(4, math.ceil(math.log2(max(vocab, 1)))))


def row_stats(
    z: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp, lse, entropy or empty, finite) in float32 of the [R, V] raw logits ``z`` (before the temperature)."""
    if z.stride(-1) != 1:
        z = z.contiguous()
    rows, vocab = z.shape
    logp = torch.empty(rows, dtype=torch.float32, device=z.device)
    lse = torch.empty_like(logp)
    entropy = torch.empty(rows if with_entropy else 1, dtype=torch.float32, device=z.device)
    finite = torch.empty(rows, dtype=torch.int8, device=z.device)
    if rows:
        row_stats_kernel, _ = _kernels()
        row_stats_kernel[(rows,)](
            z,
            z.stride(0),
            targets.contiguous(),
            logp,
            lse,
            entropy,
            finite,
            vocab,
            1.0 / temperature,
            math.log(vocab),
            WITH_ENTROPY=with_entropy,
            BLOCK=_block(vocab, FORWARD_BLOCK),
            num_warps=8,
        )
    return logp, lse, entropy[:rows] if with_entropy else entropy[:0], finite.bool()


def logit_gradient_(
    z: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad_rows: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Overwrite the [R, V] raw logits ``z`` with ``d loss / d z`` and return it.

    ``grad_rows``: float32 ``d loss / d logp`` per row divided by the temperature, 0 for a row that
    must get no gradient; ``lse``: the forward's log-sum-exp of ``z / temperature``.
    """
    if z.stride(-1) != 1:
        raise ValueError("logit_gradient_ writes in place: the logits' rows must be contiguous")
    rows, vocab = z.shape
    if rows:
        _, logit_gradient_kernel = _kernels()
        logit_gradient_kernel[(rows,)](
            z,
            z.stride(0),
            targets.contiguous(),
            lse.float().contiguous(),
            grad_rows.float().contiguous(),
            vocab,
            1.0 / temperature,
            BLOCK=_block(vocab, BACKWARD_BLOCK),
            num_warps=8,
        )
    return z


# Rows of the first chunk that the kernels are checked on (see kernels_agree).
CHECK_ROWS = 64
# Per (device, logits dtype): whether the kernels agreed with the eager arithmetic on first use.
_AGREED: dict[tuple[torch.device, torch.dtype], bool] = {}


def kernels_agree(z: torch.Tensor, targets: torch.Tensor, temperature: float) -> bool:
    """Whether the kernels agree with the eager float32 arithmetic on this device and dtype: checked
    once per process on the first ``CHECK_ROWS`` rows of ``z`` (a compiler or driver that builds
    them wrong must not train on wrong gradients silently); a disagreement warns once."""
    key = (z.device, z.dtype)
    if key not in _AGREED:
        problem = _disagreement(z[:CHECK_ROWS], targets[:CHECK_ROWS], temperature)
        _AGREED[key] = problem is None
        if problem:
            warnings.warn(
                f"the output head's Triton kernels ({z.dtype} logits on {z.device}) disagree with the eager "
                f"float32 path: {problem}; the head runs eagerly from now on (algorithm.head_kernels=false "
                "skips the kernels and this check)",
                stacklevel=4,
            )
    return _AGREED[key]


def _disagreement(z: torch.Tensor, targets: torch.Tensor, temperature: float) -> str | None:
    """What differs between the kernels and eager float32 on these rows, beyond rounding; None if nothing."""
    x = z.float() / temperature
    finite = torch.isfinite(x).all(dim=-1)
    x = torch.where(finite[:, None], x, 0.0)  # a poisoned row is scored as all zeros, as the kernels do
    lse = torch.logsumexp(x, dim=-1)
    logp = torch.where(finite, x.gather(-1, targets[:, None]).squeeze(-1) - lse, 0.0)
    log_q = torch.log_softmax(x, dim=-1)
    p = log_q.exp()
    entropy = -(p * log_q).sum(dim=-1)  # centred, as the kernels sum it: lse - E[x] would cancel
    grad = torch.where(finite, torch.linspace(-1.0, 1.0, len(z), device=z.device), 0.0)
    want_dz = -grad[:, None] * p
    want_dz[torch.arange(len(z), device=z.device), targets] += grad
    got_logp, got_lse, got_entropy, got_finite = row_stats(z, targets, temperature, with_entropy=True)
    got_dz = logit_gradient_(z.clone(), targets, got_lse, grad, temperature).float()
    if not torch.equal(got_finite, finite):
        return "they flag other rows as non-finite"
    for name, got, want in (("log-probs", got_logp, logp), ("entropies", got_entropy, entropy)):
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):  # the same float32 arithmetic, reordered
            return f"{name} differ by up to {float((got - want).abs().max()):.2e}"
    # the kernels' gradient is rounded to the logits' dtype (2^-8 of each element at most, bf16), and
    # g - g p cancels for a token of probability near 1: a few float32 ulps of |g| <= 1 either way
    bound = 2.0**-7 * want_dz.abs() + 1e-6
    if not bool(((got_dz - want_dz).abs() <= bound).all()):
        return f"logit gradients differ by up to {float((got_dz - want_dz).abs().max()):.2e}"
    return None
