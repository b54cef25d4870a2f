"""Callbacks: rollout generation (and, in later issues, weight sync and health monitoring)."""

from grpo_lightning.callbacks.async_rollout import AsyncRolloutCallback
from grpo_lightning.callbacks.rollout import RolloutCallback
from grpo_lightning.callbacks.summary import TrainingSummary
from grpo_lightning.callbacks.weight_sync import WeightSyncCallback, WeightSyncError

__all__ = ["AsyncRolloutCallback", "RolloutCallback", "TrainingSummary", "WeightSyncCallback", "WeightSyncError"]
