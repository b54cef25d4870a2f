"""Rewards that are more than a Python function, each a registered source with options
``rewards.<name>.*``: a learned reward model, an LLM judge, code run in a sandbox."""

from grpo_lightning.rewards.sources import code_sandbox as _code_sandbox  # noqa: F401  (registers)
from grpo_lightning.rewards.sources import judge as _judge  # noqa: F401  (registers)
from grpo_lightning.rewards.sources import reward_model as _reward_model  # noqa: F401  (registers)
from grpo_lightning.rewards.sources.base import SourceReward, bind_sources, build_sources, register_source

__all__ = ["SourceReward", "bind_sources", "build_sources", "register_source"]
