"""Masked importance sampling per sequence (TRL ``sequence_mask``, its default mode):
``w = R * 1[lower <= R <= upper]`` on every token, ``R = exp(sum_t d_t)``. Zeroed sequences
stay in the denominator (a weight of 0)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lightning.algorithm.corrections.base import (
    Band,
    Correction,
    CorrectionInputs,
    CorrectionOutput,
    help_field,
    register_correction,
)
from grpo_lightning.algorithm.corrections.mis_token import band_problems, band_ratio
from grpo_lightning.algorithm.corrections.tis_seq import sequence_ratio


@dataclass
class MisSeqOptions:
    """Masked IS per sequence: w = R inside [lower, upper], else 0."""

    lower: float = help_field(0.0, "Sequence ratios below this get weight 0 (>= 0; 0 = no lower bound).")
    upper: float = help_field(3.0, "Sequence ratios above this get weight 0 (> lower; TRL's cap 3).")

    def check_fields(self, p: str) -> list[str]:
        return band_problems(p, self.lower, self.upper)


@register_correction("mis_seq", options=MisSeqOptions)
class MisSeq(Correction):
    level = "sequence"

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(band_ratio(sequence_ratio(x), self.options.lower, self.options.upper), None)

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        return sequence_ratio(x)

    def band(self) -> Band:
        return Band("seq_ratio", self.options.lower, self.options.upper)
