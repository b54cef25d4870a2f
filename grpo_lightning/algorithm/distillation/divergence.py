"""The divergence form of an objective over a micro-batch's scored positions, without [B, T, V].

The step hands over each model's final hidden states at the positions that predict a completion
token, and its output head (:class:`HeadRows`). An objective with a ``chunked`` form (``jsd``)
computes it chunk by chunk over the vocabulary itself; any other divergence gets its logits a
chunk of rows at a time, each chunk recomputed in the backward (activation checkpointing), so at
most one chunk's [rows, V] logits of each model are alive at once. Both logits are divided by
the sampling temperature first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from grpo_lightning.algorithm.distillation.objectives import TeacherObjective


@dataclass(frozen=True)
class HeadRows:
    """A model's final hidden states at the scored positions and its output head: logits = h W^T + b."""

    hidden: torch.Tensor  # [r, H]
    weight: torch.Tensor  # [V, H]
    bias: torch.Tensor | None = None

    def logits(self, vocab: int, temperature: float, rows: slice = slice(None)) -> torch.Tensor:
        """Float32 logits [rows, vocab] (the first ``vocab`` columns) divided by the temperature."""
        bias = self.bias[:vocab] if self.bias is not None else None
        z = F.linear(self.hidden[rows], self.weight[:vocab], bias)
        z = z.to(torch.promote_types(z.dtype, torch.float32))
        return z / temperature if temperature != 1.0 else z


def shared_vocab(student: HeadRows, teacher: HeadRows) -> int:
    """The vocabulary both heads score: the smaller head (a head padded past the tokenizer, as
    Qwen2.5-7B's 152064 rows against 0.5B's 151936, has rows no real token uses)."""
    return min(student.weight.shape[0], teacher.weight.shape[0])


def divergence_rows(
    objective: TeacherObjective,
    student: HeadRows,
    teacher: HeadRows,
    options: Any,
    temperature: float,
    budget_mb: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per-position divergence [r] with gradient, finite [r])`` of a divergence-form objective."""
    if objective.divergence is None:
        raise ValueError(f"teacher objective {objective.name!r} is not a divergence")
    teacher = HeadRows(teacher.hidden.to(student.hidden.device), teacher.weight, teacher.bias)
    if objective.chunked is not None:
        return objective.chunked(student, teacher, options, temperature, budget_mb)
    vocab = shared_vocab(student, teacher)
    step = max(1, int(budget_mb * 2**20) // (2 * 4 * vocab))

    def chunk(h_s: torch.Tensor, h_t: torch.Tensor) -> torch.Tensor:
        z_s = HeadRows(h_s, student.weight, student.bias).logits(vocab, temperature)
        with torch.no_grad():
            z_t = HeadRows(h_t, teacher.weight, teacher.bias).logits(vocab, temperature)
        ok = torch.isfinite(z_s).all(dim=-1) & torch.isfinite(z_t).all(dim=-1)
        z_s = torch.where(ok[:, None], z_s, 0.0)
        z_t = torch.where(ok[:, None], z_t, 0.0)
        return torch.where(ok, objective.divergence(z_s, z_t, options), torch.nan)

    rows = student.hidden.shape[0]
    parts = []
    for start in range(0, rows, step):
        h_s, h_t = student.hidden[start : start + step], teacher.hidden[start : start + step]
        grad = torch.is_grad_enabled() and (h_s.requires_grad or student.weight.requires_grad)
        parts.append(checkpoint(chunk, h_s, h_t, use_reentrant=False) if grad and rows > step else chunk(h_s, h_t))
    value = torch.cat(parts) if parts else student.hidden.new_zeros(0, dtype=torch.float32)
    finite = torch.isfinite(value)
    return torch.where(finite, value, 0.0), finite
