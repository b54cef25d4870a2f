"""Off-policy sequence mask of DeepSeek-V3.2 (TRL ``off_policy_mask_threshold``, slime
``--use-opsm``): drop a sequence iff its advantage is negative AND
``mean_t (log pi_eng(y_t) - log pi_train(y_t)) > delta``, each token's log-ratio clamped to +-20
before the mean (verl's k1 convention). Positive and zero advantages are never
masked: learning from one's own good samples is safe however stale, pushing down a bad one that
the current policy barely produces is what destabilizes. ``delta`` is required: the paper gives
none, and TRL (0.5) and slime (1e-4) differ by four orders of magnitude."""

from __future__ import annotations

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


@dataclass
class OpsmOptions:
    """DeepSeek-V3.2 off-policy sequence mask: drop iff A < 0 and mean_t(logp_eng - logp_train) > delta."""

    delta: float | None = help_field(
        None, "Required: drift bound in nats per token (> 0; TRL suggests 0.5, slime 1e-4)."
    )  # noqa: UP045

    def check_fields(self, p: str) -> list[str]:
        return positive(p, delta=self.delta)


@register_correction("opsm", options=OpsmOptions)
class Opsm(SequenceMask):
    required = ("delta",)

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        drift = x.seq_mean(-x.clamped_log_ratio)
        drop = (x.advantages.float() < 0) & (drift > self.options.delta)
        return CorrectionOutput(None, x.per_token(~drop))

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        return x.per_token(x.seq_mean(-x.clamped_log_ratio))

    def band(self) -> Band:
        return Band("seq_mean_engine_minus_train_logp", None, self.options.delta)
