"""Masked importance sampling per token (TRL ``token_mask``, slime ``tis_mode=mask``):
``w_t = r_t * 1[lower <= r_t <= upper]``. The zeroed tokens stay in the loss's denominator
(a weight of 0, not a mask), as TRL does."""

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


def band_ratio(ratio: torch.Tensor, lower: float, upper: float) -> torch.Tensor:
    """``ratio`` where ``lower <= ratio <= upper``, else 0."""
    return torch.where((ratio >= lower) & (ratio <= upper), ratio, 0.0)


def band_problems(p: str, lower: float, upper: float) -> list[str]:
    problems = [] if lower >= 0 else [f"{p}lower={lower} must be >= 0"]
    return problems + ([] if upper > lower else [f"{p}upper={upper} must be > {p}lower={lower}"])


@dataclass
class MisTokenOptions:
    """Masked IS per token: w_t = r_t inside [lower, upper], else 0."""

    lower: float = help_field(0.0, "Token ratios below this get weight 0 (>= 0; 0 = no lower bound).")
    upper: float = help_field(3.0, "Token ratios above this get weight 0 (> lower; TRL's cap 3).")

    def check_fields(self, p: str) -> list[str]:
        return band_problems(p, self.lower, self.upper)


class BandedTokenRatio(Correction):
    """``w_t = r_t`` inside the options' [lower, upper], else 0 (MIS token, IcePop)."""

    level = "token"

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(band_ratio(x.token_ratio, self.options.lower, self.options.upper), None)

    def band(self) -> Band:
        return Band("token_ratio", self.options.lower, self.options.upper)


@register_correction("mis_token", options=MisTokenOptions)
class MisToken(BandedTokenRatio):
    pass
