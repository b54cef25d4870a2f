"""Truncated importance sampling (TIS), the first off-policy correction, kept as a function.

Now two registered corrections, ``tis_token`` and ``tis_seq`` (:mod:`.corrections`); the config
keys ``algorithm.is_level`` / ``algorithm.is_cap`` still select them (deprecated aliases of
``algorithm.corrections=[tis_token] algorithm.tis_token.cap=...``). Yao et al. 2025, "Your
efficient RL framework secretly brings you off-policy RL training"; TRL's truncate modes and
verl's ``rollout_is``:

* ``token``:    ``w_t = min(exp(log pi_old(y_t) - log mu(y_t)), cap)``
* ``sequence``: ``w   = min(exp(sum_t log pi_old(y_t) - log mu(y_t)), cap)`` for every token

Log-ratios are clamped to [-20, 20] before ``exp`` (F3). Weights are detached.
"""

from __future__ import annotations

import torch

from grpo_lightning.algorithm.corrections.base import CorrectionInputs, ImportanceWeights
from grpo_lightning.algorithm.corrections.select import LEGACY_IS_LEVELS, apply_corrections
from grpo_lightning.algorithm.corrections.tis_seq import TisSeq, TisSeqOptions
from grpo_lightning.algorithm.corrections.tis_token import TisToken, TisTokenOptions

IS_LEVELS = ("none", *LEGACY_IS_LEVELS)
LOG_RATIO_CLAMP = 20.0

__all__ = ["IS_LEVELS", "ImportanceWeights", "truncated_importance_weights"]


def truncated_importance_weights(
    trainer_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    cap: float = 2.0,
) -> ImportanceWeights:
    """TIS weights [B, T] and the mismatch statistics; ``mask`` [B, T] is 1 on real tokens
    (``level="none"``: weights 1, the statistics of the token ratio against ``cap``)."""
    if level not in IS_LEVELS:
        raise ValueError(f"importance sampling level {level!r} is not one of {IS_LEVELS}")
    x = CorrectionInputs(trainer_logp, engine_logp, mask.float(), torch.zeros(mask.shape[0]))
    correction = TisSeq(TisSeqOptions(cap)) if level == "sequence" else TisToken(TisTokenOptions(cap))
    out = apply_corrections([correction], x)
    return out._replace(weights=torch.ones_like(out.weights)) if level == "none" else out
