"""Truncated importance sampling (TIS) between the sampler's and the trainer's log-probs.

Completions are sampled by the engine under ``mu`` (vLLM's kernels, possibly weights one or
more steps old in async mode) while the loss assumes the trainer's ``pi_old``. Weighting each
token's loss by ``w = min(pi_old / mu, cap)`` corrects the mismatch with bounded variance
(Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training";
the same estimator as TRL's ``vllm_importance_sampling_*`` truncate modes and verl's
``rollout_is``):

* ``token``:    ``w_t = min(exp(log pi_old(y_t) - log mu(y_t)), cap)``
* ``sequence``: ``w   = min(exp(sum_t log pi_old(y_t) - log mu(y_t)), cap)`` for every token

Log-ratios are clamped to [-20, 20] before ``exp`` (F3). Weights are detached: they scale
the gradient, they are not optimized.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

IS_LEVELS = ("none", "token", "sequence")
LOG_RATIO_CLAMP = 20.0


class ImportanceWeights(NamedTuple):
    weights: torch.Tensor  # [B, T] detached, 1 where level == "none"
    abs_diff_sum: float  # sum over masked tokens of |log pi_old - log mu|
    ratio_max: float  # the largest untruncated ratio (token or sequence), over masked tokens
    truncated: float  # how many masked tokens had their weight cut at the cap


def truncated_importance_weights(
    trainer_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    cap: float = 2.0,
) -> ImportanceWeights:
    """TIS weights [B, T] and the mismatch statistics; ``mask`` [B, T] is 1 on real tokens."""
    if level not in IS_LEVELS:
        raise ValueError(f"importance sampling level {level!r} is not one of {IS_LEVELS}")
    mask = mask.float()
    with torch.no_grad():
        log_ratio = (trainer_logp.detach().float() - engine_logp.float()) * mask
        if level == "sequence":
            seq = log_ratio.sum(dim=1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            ratio = torch.exp(seq).expand_as(log_ratio)
        else:
            ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        on = mask > 0
        ratio_max = float(ratio[on].max()) if on.any() else 1.0
        truncated = float(((ratio > cap) & on).sum())
        weights = ratio.clamp(max=cap) if level != "none" else torch.ones_like(ratio)
        return ImportanceWeights(
            weights=weights,
            abs_diff_sum=float(log_ratio.abs().sum()),
            ratio_max=ratio_max,
            truncated=truncated,
        )
