"""The full-distribution objective: generalised Jensen-Shannon divergence (GKD, Agarwal et al.
2024, eq. 1; TRL's ``generalized_jsd_loss``), chunk by chunk over the vocabulary.

With ``p = softmax(z_student / T)``, ``q = softmax(z_teacher / T)`` at one position and
``m = beta q + (1 - beta) p``,

    JSD_beta(p, q) = beta KL(q || m) + (1 - beta) KL(p || m)            0 < beta < 1
    beta = 0:  KL(q || p) = sum_v q (log q - log p)      forward KL, teacher || student (mode-covering)
    beta = 1:  KL(p || q) = sum_v p (log p - log q)      reverse KL, student || teacher (mode-seeking)

(the two ends are special-cased as in TRL: the formula itself is 0 there). ``JSD_beta / beta ->
KL(q || p)`` as beta -> 0 and ``JSD_beta <= H(beta) <= ln 2``, so the loss scale jumps at the ends:
retune the learning rate when switching between a JSD and a pure KL.

**Memory.** The [rows, V] logits of either model are never built. :class:`ChunkedJSD` computes
them ``vocab_chunk`` columns at a time from the final hidden states and the output heads, in two
passes: the first keeps a running max and sum of exponentials (the log-normalisers of ``p`` and
``q``), the second sums the divergence and ``S = sum_v p_v g_v``. The backward rebuilds each block
and turns it into its gradient,

    d JSD / d z_v = p_v (g_v - S) / T,   g_v = (1 - beta)(log p_v - log m_v)   (beta = 1: log p_v - log q_v)
    beta = 0:  d KL(q || p) / d z_v = (p_v - q_v) / T

then ``dh = dz W`` and ``dW = dz^T h`` (the teacher gets no gradient). Only [rows, vocab_chunk]
blocks exist, in both directions; the price is the head matmuls twice in the forward and twice more
in the backward. A row whose logits are not all finite gets divergence 0, ``finite=False`` and no
gradient (as the log-prob pass treats it, F3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from grpo_lightning.algorithm.distillation.divergence import HeadRows, shared_vocab
from grpo_lightning.algorithm.distillation.objectives import register_teacher_objective


@dataclass
class JSDOptions:
    """The generalised JSD (``algorithm.teacher.jsd.*``)."""

    beta: float = field(
        default=0.5,
        metadata={
            "help": "In [0, 1], TRL's convention: 0 = forward KL(teacher || student), 1 = reverse KL(student || teacher), between: the JSD."
        },
    )

    def check_fields(self, p: str) -> list[str]:
        ok = 0.0 <= self.beta <= 1.0
        return [] if ok else [f"{p}beta={self.beta} must be in [0, 1] (0: forward KL, 1: reverse KL)"]


def jsd_from_logits(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float) -> torch.Tensor:
    """The divergence of the module doc per position, written out over the whole vocabulary
    (``[..., V]`` logits already divided by the temperature -> ``[...]``): the explicit form,
    differentiable in the student's logits. What :class:`ChunkedJSD` must equal."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    lp = torch.log_softmax(student_logits.to(dtype), dim=-1)
    lq = torch.log_softmax(teacher_logits.to(dtype), dim=-1)
    if beta == 0.0:
        return (lq.exp() * (lq - lp)).sum(-1)
    if beta == 1.0:
        return (lp.exp() * (lp - lq)).sum(-1)
    lm = torch.logaddexp(lp + math.log(1.0 - beta), lq + math.log(beta))
    return beta * (lq.exp() * (lq - lm)).sum(-1) + (1.0 - beta) * (lp.exp() * (lp - lm)).sum(-1)


def _block(rows: HeadRows, start: int, stop: int, temperature: float) -> torch.Tensor:
    """Float32 (float64 for float64 weights) logits of vocabulary columns [start, stop), over the temperature."""
    bias = rows.bias[start:stop] if rows.bias is not None else None
    z = F.linear(rows.hidden, rows.weight[start:stop], bias)
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def _log_normalizer(rows: HeadRows, vocab: int, chunk: int, temperature: float) -> torch.Tensor:
    """``logsumexp`` over the first ``vocab`` logits of each row, from a running max and sum."""
    dtype = torch.promote_types(rows.hidden.dtype, torch.float32)
    top = torch.full((rows.hidden.shape[0],), -math.inf, dtype=dtype, device=rows.hidden.device)
    total = torch.zeros_like(top)
    for start in range(0, vocab, chunk):
        z = _block(rows, start, min(start + chunk, vocab), temperature)
        new_top = torch.maximum(top, z.max(dim=-1).values)
        total = total * torch.exp(top - new_top) + torch.exp(z - new_top[:, None]).sum(dim=-1)
        top = new_top
    return top + total.log()


def _terms(lp: torch.Tensor, lq: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the divergence's terms of a block, ``g`` of the module doc; None for beta = 0)."""
    p, q = lp.exp(), lq.exp()
    if beta == 0.0:
        return q * (lq - lp), None
    if beta == 1.0:
        return p * (lp - lq), lp - lq
    lm = torch.logaddexp(lp + math.log(1.0 - beta), lq + math.log(beta))
    return beta * q * (lq - lm) + (1.0 - beta) * p * (lp - lm), (1.0 - beta) * (lp - lm)


class ChunkedJSD(torch.autograd.Function):
    """Per-row generalised JSD of a student and a teacher given as :class:`HeadRows` (see the
    module doc); returns ``(divergence [r], finite [r])`` with a gradient for the student's hidden
    states, head weight and bias."""

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, teacher_hidden, teacher_weight, teacher_bias, beta, temperature, vocab, chunk
    ):
        student = HeadRows(hidden, weight, bias)
        teacher = HeadRows(teacher_hidden, teacher_weight, teacher_bias)
        with torch.no_grad():
            lse_s = _log_normalizer(student, vocab, chunk, temperature)
            lse_t = _log_normalizer(teacher, vocab, chunk, temperature)
            value = torch.zeros_like(lse_s)
            s = torch.zeros_like(lse_s)
            for start in range(0, vocab, chunk):
                stop = min(start + chunk, vocab)
                lp = _block(student, start, stop, temperature) - lse_s[:, None]
                lq = _block(teacher, start, stop, temperature) - lse_t[:, None]
                terms, g = _terms(lp, lq, beta)
                value += terms.sum(dim=-1)
                if g is not None:
                    s += (lp.exp() * g).sum(dim=-1)
            finite = torch.isfinite(lse_s) & torch.isfinite(lse_t) & torch.isfinite(value) & torch.isfinite(s)
            value = torch.where(finite, value, 0.0)
        ctx.save_for_backward(
            hidden, weight, bias, teacher_hidden, teacher_weight, teacher_bias, lse_s, lse_t, s, finite
        )
        ctx.settings = (beta, temperature, vocab, chunk)
        ctx.mark_non_differentiable(finite)
        return value, finite

    @staticmethod
    def backward(ctx, grad_value, _grad_finite):
        hidden, weight, bias, t_hidden, t_weight, t_bias, lse_s, lse_t, s, finite = ctx.saved_tensors
        beta, temperature, vocab, chunk = ctx.settings
        student, teacher = HeadRows(hidden, weight, bias), HeadRows(t_hidden, t_weight, t_bias)
        scale = torch.where(finite, grad_value.to(lse_s.dtype), 0.0)[:, None] / temperature
        h32 = hidden.to(lse_s.dtype)
        grad_hidden = torch.zeros_like(h32)
        grad_weight = torch.zeros_like(weight, dtype=lse_s.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=lse_s.dtype) if bias is not None and ctx.needs_input_grad[2] else None
        for start in range(0, vocab, chunk):
            stop = min(start + chunk, vocab)
            with torch.no_grad():
                lp = _block(student, start, stop, temperature) - lse_s[:, None]
                lq = _block(teacher, start, stop, temperature) - lse_t[:, None]
                _, g = _terms(lp, lq, beta)
                p = lp.exp()
                dz = (p - lq.exp()) if g is None else p * (g - s[:, None])
                dz = torch.where(finite[:, None], dz * scale, 0.0)
                grad_hidden += dz @ weight[start:stop].to(dz.dtype)
                if grad_weight is not None:
                    grad_weight[start:stop] = dz.t() @ h32
                if grad_bias is not None:
                    grad_bias[start:stop] = dz.sum(dim=0)
        return (
            grad_hidden.to(hidden.dtype),
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None, None, None, None, None, None, None,
        )  # fmt: skip


def vocab_chunk(rows: int, budget_mb: float) -> int:
    """Vocabulary columns per block so that a block's float32 temporaries (about six per block:
    both models' logits, log-probs and the divergence terms) fit ``budget_mb``."""
    return max(256, int(budget_mb * 2**20) // (6 * 4 * max(rows, 1)))


def chunked_jsd(
    student: HeadRows, teacher: HeadRows, beta: float, temperature: float, budget_mb: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(divergence [r], finite [r])`` of :class:`ChunkedJSD` over the vocabulary both heads share
    (:func:`shared_vocab`)."""
    vocab = shared_vocab(student, teacher)
    chunk = vocab_chunk(student.hidden.shape[0], budget_mb)
    return ChunkedJSD.apply(
        student.hidden,
        student.weight,
        student.bias,
        teacher.hidden.to(student.hidden.device),
        teacher.weight,
        teacher.bias,
        float(beta),
        float(temperature),
        vocab,
        chunk,
    )


def chunked_jsd_objective(
    student: HeadRows, teacher: HeadRows, options: JSDOptions, temperature: float, budget_mb: float
):
    """The ``chunked`` form of the registered ``jsd`` (options: ``algorithm.teacher.jsd``)."""
    return chunked_jsd(student, teacher, options.beta, temperature, budget_mb)


@register_teacher_objective("jsd", options=JSDOptions, form="divergence", chunked=chunked_jsd_objective)
def jsd_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, options: JSDOptions) -> torch.Tensor:
    """The registered entry: :func:`jsd_from_logits` with ``algorithm.teacher.jsd.beta``; the step
    computes it chunked over the vocabulary (:func:`chunked_jsd_objective`, the same numbers)."""
    return jsd_from_logits(student_logits, teacher_logits, options.beta)
