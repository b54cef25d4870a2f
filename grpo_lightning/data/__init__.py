"""Prompt data: the DataModule and the tasks that fill it."""

from grpo_lightning.data.arithmetic import arithmetic_records
from grpo_lightning.data.datamodule import PromptDataModule

__all__ = ["PromptDataModule", "arithmetic_records"]
