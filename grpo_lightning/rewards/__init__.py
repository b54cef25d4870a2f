"""Reward functions, their registry, and weighted scoring.

The generic rewards live here; each task's own rewards live with it (``grpo_lightning/tasks/``)."""

from grpo_lightning.rewards import accuracy as _accuracy  # noqa: F401  (registers rewards)
from grpo_lightning.rewards import generic as _generic  # noqa: F401  (registers rewards)
from grpo_lightning.rewards import overlong as _overlong  # noqa: F401  (registers rewards)
from grpo_lightning.rewards import sources as _sources  # noqa: F401  (registers reward_model, judge, code_tests)
from grpo_lightning.rewards.calling import RewardState
from grpo_lightning.rewards.config_check import reward_name_problems
from grpo_lightning.rewards.lookup import find_reward
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS, get_reward, register_reward
from grpo_lightning.rewards.scorer import RewardFunctionError, RewardScorer, WeightedReward

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunctionError",
    "RewardScorer",
    "RewardState",
    "WeightedReward",
    "find_reward",
    "get_reward",
    "register_reward",
    "reward_name_problems",
]
