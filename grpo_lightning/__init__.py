"""grpo_lightning: GRPO as a PyTorch Lightning module plus callbacks, built never to fail silently.

Importing the package has no side effects and imports no Lightning: the names below load on
first use (PEP 562), so the CLI can apply ``trainer.huge_pages`` before torch's first CPU
allocation (which importing lightning makes; see ``models/allocator.py``), and check a command
line before importing torch at all. The built-in tasks register on the first look at ``TASKS``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_lightning.config import TrainConfig, validate_config
    from grpo_lightning.rollout import HFEngine, RolloutBatch, RolloutGenerator, Sampling
    from grpo_lightning.step.module import GRPOModule

# Each public name and the module that defines it.
_EXPORTS = {
    "GRPOModule": "grpo_lightning.step.module",
    "HFEngine": "grpo_lightning.rollout",
    "RolloutBatch": "grpo_lightning.rollout",
    "RolloutGenerator": "grpo_lightning.rollout",
    "Sampling": "grpo_lightning.rollout",
    "TrainConfig": "grpo_lightning.config",
    "validate_config": "grpo_lightning.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpo_lightning' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
