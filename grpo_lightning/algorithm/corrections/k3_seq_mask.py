"""k3 sequence mask (verl ``rollout_rs=seq_mean_k3``): keep a sequence iff
``mean_t (r_t - 1 - d_t) <= threshold``; k3 = r - 1 - log r >= 0 estimates KL(pi_eng || pi_train)
on engine samples and is 0 exactly when the log-probs agree. ``d`` is clamped to +-20 in both terms."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lightning.algorithm.corrections.base import (
    LOG_RATIO_CLAMP,
    Band,
    CorrectionInputs,
    CorrectionOutput,
    SequenceMask,
    help_field,
    positive,
    register_correction,
)


def token_k3(x: CorrectionInputs) -> torch.Tensor:
    """[B, T] ``exp(d) - 1 - d`` with ``d`` clamped to +-20 (verl's convention)."""
    d = x.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(d) - 1.0 - d


@dataclass
class K3SeqMaskOptions:
    """k3 sequence mask: keep iff mean_t(r_t - 1 - d_t) <= threshold."""

    threshold: float = help_field(0.01, "Largest mean per-token k3 divergence a kept sequence may have (> 0).")

    def check_fields(self, p: str) -> list[str]:
        return positive(p, threshold=self.threshold)


@register_correction("k3_seq_mask", options=K3SeqMaskOptions)
class K3SeqMask(SequenceMask):
    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(None, self.statistic(x) <= self.options.threshold)

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        return x.per_token(x.seq_mean(token_k3(x)))

    def band(self) -> Band:
        return Band("seq_mean_k3", None, self.options.threshold)
