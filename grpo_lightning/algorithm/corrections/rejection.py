"""Rejection sampling on a divergence estimate (verl ``rollout_rs=<aggregation>_<estimator>``,
AReaL ``rejection_sampling``): per token ``k1 = -d`` (log pi_eng / pi_train), ``k2 = d^2 / 2``,
``k3 = e^d - 1 - d`` (``d`` clamped to +-20), aggregated per ``token``, ``seq_sum``, ``seq_mean``
or ``seq_max``; a token or sequence whose statistic exceeds ``upper`` is masked (k1 also below
``lower``; its bounds are on the ratio pi_eng / pi_train and compared as logs, exactly verl's
convention, the opposite direction of every other ratio here). ``upper`` is required, as in verl."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from grpo_lightning.algorithm.corrections.base import (
    LOG_RATIO_CLAMP,
    Band,
    Correction,
    CorrectionInputs,
    CorrectionOutput,
    bounds,
    help_field,
    register_correction,
)
from grpo_lightning.algorithm.corrections.k3_seq_mask import token_k3

ESTIMATORS = ("k1", "k2", "k3")
AGGREGATIONS = ("token", "seq_sum", "seq_mean", "seq_max")


@dataclass
class RejectionOptions:
    """Rejection on a k1/k2/k3 divergence per token, or its sum/mean/max per sequence."""

    estimator: str = help_field("k3", f"Per-token divergence, one of {ESTIMATORS} (k1 = log pi_eng / pi_train).")
    aggregation: str = help_field("token", f"How it is aggregated, one of {AGGREGATIONS}.")
    upper: float | None = help_field(None, "Required: the largest statistic kept (k1: a bound on pi_eng / pi_train).")  # noqa: UP045
    lower: Optional[float] = help_field(None, "k1 only: the smallest pi_eng / pi_train kept; null: 1 / upper (verl).")  # noqa: UP045

    def check_fields(self, p: str) -> list[str]:
        problems = (
            [] if self.estimator in ESTIMATORS else [f"{p}estimator={self.estimator!r} is not one of {ESTIMATORS}"]
        )
        if self.aggregation not in AGGREGATIONS:
            problems.append(f"{p}aggregation={self.aggregation!r} is not one of {AGGREGATIONS}")
        if self.estimator == "k1" and self.aggregation == "seq_max":
            problems.append(f"{p}aggregation=seq_max needs estimator k2 or k3 (a max of the signed k1 means nothing)")
        if self.lower is not None and self.estimator != "k1":
            problems.append(f"{p}lower={self.lower} applies to estimator=k1 only; set it to null")
        return problems + bounds(p, self.lower if self.estimator == "k1" else None, self.upper)


@register_correction("rejection", options=RejectionOptions)
class Rejection(Correction):
    changes_denominator = True
    is_weight = False
    required = ("upper",)

    def __init__(self, options: Any):
        super().__init__(options)
        self.level = "token" if options.aggregation == "token" else "sequence"

    def _token_stat(self, x: CorrectionInputs) -> torch.Tensor:
        d = x.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return {"k1": lambda: -d, "k2": lambda: 0.5 * d * d, "k3": lambda: token_k3(x)}[self.options.estimator]()

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        values, how = self._token_stat(x), self.options.aggregation
        if how == "token":
            return values
        return x.per_token({"seq_sum": x.seq_sum, "seq_mean": x.seq_mean, "seq_max": x.seq_max}[how](values))

    def band(self) -> Band:
        o = self.options
        name = f"{o.aggregation}_{o.estimator}"
        if o.estimator == "k1":
            lower = o.lower if o.lower is not None else 1.0 / o.upper
            return Band(name, math.log(lower), math.log(o.upper))
        return Band(name, None, o.upper)

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(None, ~self.outside(x))
