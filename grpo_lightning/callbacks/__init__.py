"""Callbacks that observe the step: health monitoring, completions tables, the run's report and summary.

None of them is load-bearing: rollout generation and weight sync belong to the module's
:class:`~grpo_lightning.rollout.RolloutGenerator` (see ``GRPOModule``), so a plain
``Trainer`` trains correctly with or without them.
"""

from grpo_lightning.callbacks.completions_table import CompletionsTable
from grpo_lightning.callbacks.health import HealthMonitor
from grpo_lightning.callbacks.progress import RunProgress
from grpo_lightning.callbacks.run_report import RunReport
from grpo_lightning.callbacks.summary import TrainingSummary

__all__ = [
    "CompletionsTable",
    "HealthMonitor",
    "RunProgress",
    "RunReport",
    "TrainingSummary",
]
