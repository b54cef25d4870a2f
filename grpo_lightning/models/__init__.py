"""Building and loading policies: the tiny in-code model and local Hugging Face folders."""

from grpo_lightning.models import smollm2
from grpo_lightning.models.loading import load_policy
from grpo_lightning.models.tiny import build_char_tokenizer, build_tiny_policy

__all__ = ["build_char_tokenizer", "build_tiny_policy", "load_policy", "smollm2"]
