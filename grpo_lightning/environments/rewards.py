"""``environment``: the reward function that hands the environment's own reward to the scorer.

An episode's reward is the weighted sum of ``task.rewards`` like any other rollout's; naming
``environment`` there (with its weight) counts the environment's aggregated reward, and any
other reward function sees the whole trajectory TRL-style: ``prompts`` (the first messages),
``completions`` (every message after them), and the keyword arguments ``messages``,
``completion_ids``, ``env_reward``, ``info``, ``stop_reason`` and ``num_turns``.
"""

from __future__ import annotations

from grpo_lightning.rewards.registry import register_reward


@register_reward("environment")
def environment_reward(prompts, completions, env_reward=None, **_) -> list[float | None]:
    """The environment's reward, combined over the episode by ``task.reward_aggregator``; None outside episodes."""
    if env_reward is None:
        return [None] * len(completions)
    return [None if r is None else float(r) for r in env_reward]
