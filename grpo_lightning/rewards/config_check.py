"""The config rules of rewards: every name in ``task.rewards`` and ``task.correctness_reward``
names a reward function (registered, a top-level callable of ``task.reward_modules`` / ``plugins``,
or ``pkg.module:function``; closest match suggested), and every weight is finite.

Registered with :func:`grpo_lightning.config.register_config_check` on import, so the schema
layer stays free of imports from here.
"""

from __future__ import annotations

import math

from grpo_lightning.config import TrainConfig, register_config_check
from grpo_lightning.errors import PluginError
from grpo_lightning.registry import load_plugins
from grpo_lightning.rewards.lookup import reward_problem


@register_config_check
def reward_name_problems(cfg: TrainConfig) -> list[str]:
    """Names in ``task.rewards`` and ``task.correctness_reward`` that name no reward function."""
    modules = cfg.plugin_entries()
    try:
        load_plugins(modules)
    except PluginError:
        return []  # validate_config reports the file that failed; names in it cannot be checked
    named = [(f"task.rewards.{name}", name) for name in cfg.task.rewards]
    if cfg.task.correctness_reward is not None:
        named.append(("task.correctness_reward", cfg.task.correctness_reward))
    return [problem for field, name in named if (problem := reward_problem(name, modules, field)) is not None]


@register_config_check
def reward_weight_problems(cfg: TrainConfig) -> list[str]:
    """Non-finite weights: a NaN weight silently drops its reward, an inf one makes every group tied."""
    return [
        f"task.rewards.{name}={weight} must be a finite number (the weight of reward {name!r})"
        for name, weight in cfg.task.rewards.items()
        if not math.isfinite(float(weight))
    ]
