"""Veto (slime; verl's older ``rollout_token_veto_threshold``): drop a sequence if any of its
tokens has ``r_t < threshold``, a token the trainer finds catastrophically less likely than the
engine did. Compared in log space (``min_t d_t < log threshold``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_lightning.algorithm.corrections.base import (
    Band,
    CorrectionInputs,
    CorrectionOutput,
    SequenceMask,
    help_field,
    positive,
    register_correction,
)


def min_log_ratio(x: CorrectionInputs) -> torch.Tensor:
    """[B] the smallest masked ``d_t`` (clamped to +-20) per row (0 for a row with none)."""
    return -x.seq_max(-x.clamped_log_ratio)


@dataclass
class VetoOptions:
    """Veto: drop a sequence if any token's pi_train / pi_eng is below threshold."""

    threshold: float = help_field(1e-4, "Smallest token ratio pi_train / pi_eng a kept sequence may hold (> 0).")

    def check_fields(self, p: str) -> list[str]:
        return positive(p, threshold=self.threshold)


@register_correction("veto", options=VetoOptions)
class Veto(SequenceMask):
    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(None, x.per_token(min_log_ratio(x) >= math.log(self.options.threshold)))

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        return x.per_token(torch.exp(min_log_ratio(x)))

    def band(self) -> Band:
        return Band("seq_min_token_ratio", self.options.threshold, None)
