"""Pure tensor math of GRPO: no Lightning, no I/O. Compose these to build your own loss.

Variants are registered by name: policy losses in ``policy_loss.py``
(:func:`register_policy_loss`), advantage estimators in ``advantages.py``
(:func:`register_advantage_estimator`); the config selects them by that name.
"""

from grpo_lightning.algorithm.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_SCALES,
    TIE_ATOL,
    TIE_RTOL,
    compute_advantages,
    group_advantages,
    register_advantage_estimator,
    rewards_equal,
    tied_groups,
)
from grpo_lightning.algorithm.aggregation import (
    LOSS_AGG_MODES,
    aggregate,
    aggregate_numerator,
    loss_normalizer,
)
from grpo_lightning.algorithm.importance import IS_LEVELS, ImportanceWeights, truncated_importance_weights
from grpo_lightning.algorithm.kl import KL_ESTIMATORS, kl_estimate
from grpo_lightning.algorithm.logprobs import TokenLogProbs, lm_head_log_probs, selective_log_probs
from grpo_lightning.algorithm.objective import (
    AggregationRecord,
    LossTerms,
    MicroBatch,
    PreparedBatch,
    aggregate_term,
    micro_batch_loss,
    sequences_in_loss,
)
from grpo_lightning.algorithm.policy_loss import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    clipped_surrogate,
    register_policy_loss,
)

__all__ = [
    "AggregationRecord",
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_SCALES",
    "IS_LEVELS",
    "ImportanceWeights",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "LossTerms",
    "MicroBatch",
    "POLICY_LOSSES",
    "PolicyLossInputs",
    "PolicyLossOutput",
    "PreparedBatch",
    "TIE_ATOL",
    "TIE_RTOL",
    "TokenLogProbs",
    "aggregate",
    "aggregate_numerator",
    "aggregate_term",
    "clipped_surrogate",
    "compute_advantages",
    "group_advantages",
    "kl_estimate",
    "lm_head_log_probs",
    "loss_normalizer",
    "micro_batch_loss",
    "register_advantage_estimator",
    "register_policy_loss",
    "rewards_equal",
    "selective_log_probs",
    "sequences_in_loss",
    "tied_groups",
    "truncated_importance_weights",
]
