"""Reward functions, their registry, and weighted scoring."""

from grpo_lightning.rewards import arithmetic as _arithmetic  # noqa: F401  (registers rewards)
from grpo_lightning.rewards import overlong as _overlong  # noqa: F401  (registers rewards)
from grpo_lightning.rewards import tasks as _tasks  # noqa: F401  (registers rewards)
from grpo_lightning.rewards.config_check import reward_name_problems
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS, get_reward, register_reward
from grpo_lightning.rewards.scorer import RewardFunctionError, RewardScorer, WeightedReward

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunctionError",
    "RewardScorer",
    "WeightedReward",
    "get_reward",
    "register_reward",
    "reward_name_problems",
]
