"""Geometric-mean sequence mask (verl ``rollout_rs=seq_mean_k1``, AReaL): keep a sequence iff
``lower <= G <= upper`` with ``G = exp(mean_t d_t)``, the per-token geometric mean of the
ratio. Unlike ``R = prod_t r_t`` it does not grow with the length: the same per-token drift
decides the same at 10 and at 1000 tokens. Compared in log space (``log lower <= mean d <= log upper``),
each ``d_t`` clamped to +-20 before the mean, as verl's seq_mean_k1.

Direction: G is train / engine, as every ratio here. verl's seq_mean_k1 bounds engine / train,
so verl's ``"a_b"`` is ``lower=1/b, upper=1/a`` here. The bounds are required: published
defaults differ by orders of magnitude (verl 0.999-1.001, older prime-rl 0.1-10)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from grpo_lightning.algorithm.corrections.base import (
    Band,
    CorrectionInputs,
    CorrectionOutput,
    SequenceMask,
    bounds,
    help_field,
    register_correction,
)


@dataclass
class GeoMaskOptions:
    """Geometric-mean sequence mask: keep iff lower <= exp(mean_t d_t) <= upper (both required)."""

    lower: Optional[float] = help_field(None, "Required: lowest geometric-mean ratio G kept (> 0; verl 0.999).")  # noqa: UP045
    upper: Optional[float] = help_field(None, "Required: highest geometric-mean ratio G kept (> lower; verl 1.001).")  # noqa: UP045

    def check_fields(self, p: str) -> list[str]:
        return bounds(p, self.lower, self.upper)


@register_correction("geo_mask", options=GeoMaskOptions)
class GeoMask(SequenceMask):
    required = ("lower", "upper")

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        mean_d = x.seq_mean(x.clamped_log_ratio)
        keep = (mean_d >= math.log(self.options.lower)) & (mean_d <= math.log(self.options.upper))
        return CorrectionOutput(None, x.per_token(keep))

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        return x.per_token(torch.exp(x.seq_mean(x.clamped_log_ratio)))

    def band(self) -> Band:
        return Band("geo_mean_ratio", self.options.lower, self.options.upper)
