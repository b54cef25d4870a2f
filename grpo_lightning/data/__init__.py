"""Prompt data: the DataModule, the sampler, prompt formatting and generic file loading
(the tasks that fill it live in :mod:`grpo_lightning.tasks`)."""

from grpo_lightning.data.datamodule import PromptDataModule

__all__ = ["PromptDataModule"]
