"""Truncated importance sampling per sequence (verl ``rollout_is=sequence``, TRL
``sequence_truncate``): ``w = min(R, cap)`` on every token, ``R = exp(sum_t d_t)`` (the
sum clamped to +-20 before ``exp``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lightning.algorithm.corrections.base import (
    LOG_RATIO_CLAMP,
    Band,
    Correction,
    CorrectionInputs,
    CorrectionOutput,
    help_field,
    positive,
    register_correction,
)


def sequence_ratio(x: CorrectionInputs) -> torch.Tensor:
    """[B, T] ``R = exp(clamp(sum_t d_t, +-20))`` broadcast over each row."""
    return x.per_token(torch.exp(x.seq_sum(x.log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)))


@dataclass
class TisSeqOptions:
    """Truncated IS per sequence: w = min(R, cap)."""

    cap: float = help_field(2.0, "Upper bound C of the sequence weight min(prod_t r_t, C) (> 0; 2-10 in practice).")

    def check_fields(self, p: str) -> list[str]:
        return positive(p, cap=self.cap)


@register_correction("tis_seq", options=TisSeqOptions)
class TisSeq(Correction):
    level = "sequence"

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(sequence_ratio(x).clamp(max=self.options.cap), None)

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        return sequence_ratio(x)

    def band(self) -> Band:
        return Band("seq_ratio", None, self.options.cap)
