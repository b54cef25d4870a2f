"""The optimization step: :class:`GRPOModule` (``module.py``) and its helpers.

``module.py`` reads as the step top to bottom; ``hooks.py`` holds the Lightning hooks around it,
``micro_batches.py`` the slices and frozen passes, ``passes.py`` each pass's bookkeeping,
``guards.py`` and ``update_check.py`` the non-finite guards (F3), ``optim.py`` the optimizer,
``metrics.py`` and ``reductions.py`` the step's metrics over ranks, ``weight_push.py`` the sync.

``GRPOModule`` loads on first use (importing this package imports no Lightning). The typed
records live in :mod:`grpo_lightning.records`; ``from grpo_lightning.step import Completion``
(their home before) still works, with a deprecation warning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_lightning.step.module import GRPOModule

_MOVED_RECORDS = (
    "TOKEN_FIELDS",
    "AggregationRecord",
    "Completion",
    "PassStats",
    "PolicyWeights",
    "RolloutBatch",
    "StepContext",
    "StepResult",
    "TokenLogProbs",
)

__all__ = ["GRPOModule"]


def __getattr__(name: str):
    if name == "GRPOModule":
        return importlib.import_module("grpo_lightning.step.module").GRPOModule
    if name in _MOVED_RECORDS:
        warnings.warn(
            f"grpo_lightning.step.{name} moved to grpo_lightning.records.{name}: "
            f"import it as `from grpo_lightning.records import {name}`",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("grpo_lightning.records"), name)
    raise AttributeError(f"module 'grpo_lightning.step' has no attribute {name!r}")
