"""The config rule that needs the reward registry: every name in ``task.rewards`` and
``task.correctness_reward`` is a registered reward function (closest match suggested).

Registered with :func:`grpo_lightning.config.register_config_check` on import, so the schema
layer stays free of imports from here.
"""

from __future__ import annotations

from grpo_lightning.config import TrainConfig, register_config_check
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS


@register_config_check
def reward_name_problems(cfg: TrainConfig) -> list[str]:
    """Unknown reward names in ``task.rewards`` and ``task.correctness_reward``."""
    named = [(f"task.rewards.{name}", name) for name in cfg.task.rewards]
    if cfg.task.correctness_reward is not None:
        named.append(("task.correctness_reward", cfg.task.correctness_reward))
    return [problem for field, name in named if (problem := REWARD_FUNCTIONS.problem(name, field)) is not None]
