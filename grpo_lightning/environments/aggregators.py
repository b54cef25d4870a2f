"""How an episode's per-step environment rewards become one reward (``task.reward_aggregator``).

Each entry takes ``(step_rewards, final_reward)``: every reward the environment gave, in order,
and the reward of the step that ended the episode (when a limit ended it: the environment's
``on_truncated`` reward, else None). Register your
own with ``@REWARD_AGGREGATORS.register("name")`` in a ``plugins=[...]`` file.
"""

from __future__ import annotations

from grpo_lightning.environments.base import REWARD_AGGREGATORS


@REWARD_AGGREGATORS.register("sum")
def total(step_rewards: list[float], final_reward: float | None) -> float:
    """Every step's reward added up (the default: a return without discounting)."""
    return float(sum(step_rewards))


@REWARD_AGGREGATORS.register("mean")
def mean(step_rewards: list[float], final_reward: float | None) -> float:
    """The mean step reward (0 when the environment gave none): long episodes earn no more for being long."""
    return float(sum(step_rewards) / len(step_rewards)) if step_rewards else 0.0


@REWARD_AGGREGATORS.register("final")
def final(step_rewards: list[float], final_reward: float | None) -> float:
    """Only the reward of the step that ended the episode (a limit ended it: on_truncated's reward, else 0)."""
    return 0.0 if final_reward is None else float(final_reward)
