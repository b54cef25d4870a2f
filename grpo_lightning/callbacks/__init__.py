"""Callbacks: rollout generation (sync / async), weight sync, health monitoring, completions tables."""

from grpo_lightning.callbacks.async_rollout import AsyncRolloutCallback
from grpo_lightning.callbacks.completions_table import CompletionsTable
from grpo_lightning.callbacks.health import HealthMonitor
from grpo_lightning.callbacks.rollout import RolloutCallback
from grpo_lightning.callbacks.summary import TrainingSummary
from grpo_lightning.callbacks.weight_sync import WeightSyncCallback, WeightSyncError

__all__ = [
    "AsyncRolloutCallback",
    "CompletionsTable",
    "HealthMonitor",
    "RolloutCallback",
    "TrainingSummary",
    "WeightSyncCallback",
    "WeightSyncError",
]
