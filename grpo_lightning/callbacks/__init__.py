"""Callbacks: rollout generation, health monitoring (and, in later issues, weight sync)."""

from grpo_lightning.callbacks.health import HealthMonitor
from grpo_lightning.callbacks.rollout import RolloutCallback

__all__ = ["HealthMonitor", "RolloutCallback"]
