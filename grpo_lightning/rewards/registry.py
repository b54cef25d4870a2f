"""Reward functions by name: ``@register_reward("name")`` makes a function usable from config.

A reward function is a plain callable ``(prompts, completions, **sample_fields) -> list[float]``;
``sample_fields`` are the dataset record's other columns (e.g. ``answer``), one value per
completion.
"""

from __future__ import annotations

from collections.abc import Callable

RewardFn = Callable[..., list[float]]
REWARD_FUNCTIONS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def decorator(fn: RewardFn) -> RewardFn:
        if name in REWARD_FUNCTIONS and REWARD_FUNCTIONS[name] is not fn:
            raise ValueError(f"a reward function named {name!r} is already registered")
        REWARD_FUNCTIONS[name] = fn
        return fn

    return decorator


def get_reward(name: str) -> RewardFn:
    if name not in REWARD_FUNCTIONS:
        raise KeyError(
            f"unknown reward function {name!r}; registered: {sorted(REWARD_FUNCTIONS)}. "
            f"Register yours with @grpo_lightning.rewards.register_reward({name!r})."
        )
    return REWARD_FUNCTIONS[name]
