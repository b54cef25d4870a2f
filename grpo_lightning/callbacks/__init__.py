"""Callbacks: rollout generation, completions tables (and, in later issues, weight sync and health monitoring)."""

from grpo_lightning.callbacks.completions_table import CompletionsTable
from grpo_lightning.callbacks.rollout import RolloutCallback
from grpo_lightning.callbacks.summary import TrainingSummary

__all__ = ["CompletionsTable", "RolloutCallback", "TrainingSummary"]
