"""Truncated importance sampling per token (Yao et al. 2025; verl ``rollout_is=token``, TRL
``token_truncate``): ``w_t = min(r_t, cap)``, ``r_t = pi_train(y_t) / pi_eng(y_t)``."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.algorithm.corrections.base import (
    Band,
    Correction,
    CorrectionInputs,
    CorrectionOutput,
    help_field,
    positive,
    register_correction,
)


@dataclass
class TisTokenOptions:
    """Truncated IS per token: w_t = min(r_t, cap)."""

    cap: float = help_field(2.0, "Upper bound C of the token weight min(pi_train / pi_eng, C) (> 0; verl's default 2).")

    def check_fields(self, p: str) -> list[str]:
        return positive(p, cap=self.cap)


@register_correction("tis_token", options=TisTokenOptions)
class TisToken(Correction):
    level = "token"

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(x.token_ratio.clamp(max=self.options.cap), None)

    def band(self) -> Band:
        return Band("token_ratio", None, self.options.cap)
