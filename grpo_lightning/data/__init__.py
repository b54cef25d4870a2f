"""Prompt data: the DataModule, the sampler, prompt formatting and generic file loading
(the tasks that fill it live in :mod:`grpo_lightning.tasks`).

``PromptDataModule`` loads on first use (PEP 562): the tasks import ``data.files`` while the
config is composed, before the CLI applies ``trainer.huge_pages``, and Lightning must not be
imported by then (see ``models/allocator.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_lightning.data.datamodule import PromptDataModule

__all__ = ["PromptDataModule"]


def __getattr__(name: str):
    if name != "PromptDataModule":
        raise AttributeError(f"module 'grpo_lightning.data' has no attribute {name!r}")
    return importlib.import_module("grpo_lightning.data.datamodule").PromptDataModule
