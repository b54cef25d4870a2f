"""The config rules of rewards: every name in ``task.rewards`` and ``task.correctness_reward``
is a registered reward function (closest match suggested), and every weight is finite.

Registered with :func:`grpo_lightning.config.register_config_check` on import, so the schema
layer stays free of imports from here.
"""

from __future__ import annotations

import math

from grpo_lightning.config import TrainConfig, register_config_check
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS


@register_config_check
def reward_name_problems(cfg: TrainConfig) -> list[str]:
    """Unknown reward names in ``task.rewards`` and ``task.correctness_reward``."""
    named = [(f"task.rewards.{name}", name) for name in cfg.task.rewards]
    if cfg.task.correctness_reward is not None:
        named.append(("task.correctness_reward", cfg.task.correctness_reward))
    return [problem for field, name in named if (problem := REWARD_FUNCTIONS.problem(name, field)) is not None]


@register_config_check
def reward_weight_problems(cfg: TrainConfig) -> list[str]:
    """Non-finite weights: a NaN weight silently drops its reward, an inf one makes every group tied."""
    return [
        f"task.rewards.{name}={weight} must be a finite number (the weight of reward {name!r})"
        for name, weight in cfg.task.rewards.items()
        if not math.isfinite(float(weight))
    ]
