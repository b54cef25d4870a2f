"""Reward functions by name: ``@register_reward("name")`` makes a function usable from config.

A reward function is a plain callable ``(prompts, completions, **sample_fields) -> list[float]``;
``sample_fields`` are the dataset record's other columns (e.g. ``answer``), one value per
completion. :data:`REWARD_FUNCTIONS` is one :class:`~grpo_lightning.registry.Registry` like every
other extension point, so an unknown name in ``task.rewards`` is refused with the closest match.
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_lightning.registry import Registry

RewardFn = Callable[..., list[float]]
REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function", "task.rewards")


def register_reward(name: str | RewardFn | None = None) -> Callable[[RewardFn], RewardFn] | RewardFn:
    """``@register_reward("name")``; ``@register_reward`` or ``register_reward(fn)`` use the function's name."""
    if callable(name):
        return REWARD_FUNCTIONS.add(name.__name__, name)

    def decorator(fn: RewardFn) -> RewardFn:
        return REWARD_FUNCTIONS.add(name or fn.__name__, fn)

    return decorator


def get_reward(name: str) -> RewardFn:
    if name not in REWARD_FUNCTIONS:
        raise KeyError(
            f"{REWARD_FUNCTIONS.problem(name, 'reward function')}. "
            f"Register yours with @grpo_lightning.rewards.register_reward({name!r})."
        )
    return REWARD_FUNCTIONS[name]
