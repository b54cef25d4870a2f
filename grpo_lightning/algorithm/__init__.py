"""Pure tensor math of GRPO: no Lightning, no I/O. Compose these to build your own loss."""

from grpo_lightning.algorithm.advantages import ADVANTAGE_SCALES, group_advantages
from grpo_lightning.algorithm.aggregation import (
    LOSS_AGG_MODES,
    aggregate,
    aggregate_numerator,
    loss_normalizer,
)
from grpo_lightning.algorithm.importance import IS_LEVELS, ImportanceWeights, truncated_importance_weights
from grpo_lightning.algorithm.kl import KL_ESTIMATORS, kl_estimate
from grpo_lightning.algorithm.logprobs import TokenLogProbs, lm_head_log_probs, selective_log_probs
from grpo_lightning.algorithm.policy_loss import PolicyLossOutput, policy_loss

__all__ = [
    "ADVANTAGE_SCALES",
    "IS_LEVELS",
    "ImportanceWeights",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "PolicyLossOutput",
    "TokenLogProbs",
    "aggregate",
    "aggregate_numerator",
    "group_advantages",
    "kl_estimate",
    "lm_head_log_probs",
    "loss_normalizer",
    "policy_loss",
    "selective_log_probs",
    "truncated_importance_weights",
]
