"""Score completions with several weighted reward functions, loudly on any misbehaviour."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpo_lightning.rewards.registry import RewardFn, get_reward


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned something other than one finite float per completion."""


@dataclass(frozen=True)
class WeightedReward:
    name: str
    fn: RewardFn
    weight: float = 1.0


class RewardScorer:
    """Total reward = sum of weight x reward over the functions; each component is kept for logging."""

    def __init__(self, rewards: Sequence[WeightedReward]):
        if not rewards:
            raise ValueError("at least one reward function is needed (task.rewards is empty)")
        self.rewards = list(rewards)

    @classmethod
    def from_names(cls, weights: dict[str, float]) -> RewardScorer:
        return cls([WeightedReward(name, get_reward(name), float(w)) for name, w in weights.items()])

    def __call__(
        self, prompts: list[str], completions: list[str], sample_fields: dict[str, list]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        components: dict[str, torch.Tensor] = {}
        for reward in self.rewards:
            try:
                values = reward.fn(prompts, completions, **sample_fields)
            except Exception as err:
                raise RewardFunctionError(
                    f"reward function {reward.name!r} raised {type(err).__name__}: {err}"
                ) from err
            components[reward.name] = self._validated(reward.name, values, len(completions))
        total = sum(r.weight * components[r.name] for r in self.rewards)
        return total, components

    @staticmethod
    def _validated(name: str, values, expected: int) -> torch.Tensor:
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError) as err:
            raise RewardFunctionError(
                f"reward function {name!r} must return a list of floats, got {type(values).__name__}: {err}"
            ) from err
        if len(values) != expected:
            raise RewardFunctionError(
                f"reward function {name!r} returned {len(values)} values for {expected} completions"
            )
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            raise RewardFunctionError(
                f"reward function {name!r} returned non-finite values at completions {bad[:5]}: "
                f"a NaN reward would poison every advantage of its group"
            )
        return torch.tensor(values, dtype=torch.float32)
