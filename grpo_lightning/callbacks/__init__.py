"""Callbacks: rollout generation (and, in later issues, weight sync and health monitoring)."""

from grpo_lightning.callbacks.rollout import RolloutCallback

__all__ = ["RolloutCallback"]
