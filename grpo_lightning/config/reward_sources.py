"""``rewards.*``: the options of the rewards that are more than a Python function (``rewards.<source>.*``).

A reward source (a reward model, an LLM judge, a code sandbox: ``grpo_lightning/rewards/sources/``,
or a user's plug-in) is a reward function with options. Its options class is registered here, in
the lowest layer, as the health checks' are (config/health.py), so the schema gets one node per
source (``rewards.judge.url``) while importing nothing above it; the sources register themselves
and are loaded by name (``builtin_modules``). Which sources are used, and their weights, is still
``task.rewards`` (``task.rewards={code_tests: 1.0}``).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.config.nodes import PluginNodes
from grpo_lightning.registry import Registry

# source name -> its options dataclass; the reward function itself is in rewards.REWARD_FUNCTIONS.
REWARD_SOURCES: Registry[type] = Registry("reward source", "rewards")


@dataclass
class RewardSourcesConfig(PluginNodes):
    """One node per registered reward source: ``rewards.reward_model``, ``rewards.judge``, ``rewards.code_tests``."""

    node_registries = (REWARD_SOURCES,)
    builtin_modules = ("grpo_lightning.rewards.sources",)
