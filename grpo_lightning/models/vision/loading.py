"""Loading a vision-language policy: ``model=tiny_vlm``, or a local folder through
``AutoModelForImageTextToText`` and ``AutoProcessor``; what is frozen, where LoRA goes.

The tokenizer returned carries the processor (:mod:`grpo_lightning.models.vision.processor`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.source import model_source
from grpo_lightning.models.vision import compat
from grpo_lightning.models.vision.families import family_of, is_vision_config
from grpo_lightning.models.vision.processor import attach_processor
from grpo_lightning.models.vision.tiny import (
    TINY_VLM_CONTEXT,
    build_tiny_processor,
    build_tiny_vlm,
    build_vision_tokenizer,
)

if TYPE_CHECKING:
    from grpo_lightning.config import ModelConfig

TINY_VLM = "tiny_vlm"


def is_vision_source(cfg: ModelConfig, source: str | None) -> bool:
    """Whether ``model.*`` names a vision-language policy (read from its config, no weights)."""
    if cfg.name_or_path == TINY_VLM:
        return True
    return source is not None and is_vision_config(AutoConfig.from_pretrained(source))


def vision_model_type(cfg: ModelConfig) -> str | None:
    """The model type of a vision-language ``model.*`` (read from its config, no weights); None for a text
    model or a name that does not resolve (its own error comes later)."""
    if cfg.name_or_path == TINY_VLM:
        return cfg.tiny_vlm.family
    try:
        config = AutoConfig.from_pretrained(model_source(cfg.name_or_path))
    except (ConfigError, OSError, ValueError):
        return None
    return config.model_type if is_vision_config(config) else None


def freezes_vision(cfg: ModelConfig) -> bool:
    """``model.freeze_vision``: auto freezes a pretrained tower and trains the tiny one (a frozen random
    tower cannot learn to see)."""
    value = str(cfg.freeze_vision).lower()
    return cfg.name_or_path != TINY_VLM if value == "auto" else value == "true"


def freeze_vision(model: nn.Module) -> int:
    """Freeze the vision side (tower and projector) of ``model``; returns the parameters frozen."""
    prefixes = family_of(model).vision_prefixes
    frozen = 0
    for name, parameter in model.named_parameters():
        if name.startswith(prefixes):
            parameter.requires_grad_(False)
            frozen += parameter.numel()
    return frozen


def language_lora_targets(model: nn.Module) -> list[str]:
    """LoRA's default on a VLM: every linear layer of the language model (the vision side keeps none)."""
    prefixes = family_of(model).vision_prefixes
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and not name.startswith(prefixes)
        and module is not model.get_output_embeddings()
    ]


def load_vision_policy(cfg: ModelConfig, source: str | None, dtype) -> tuple[nn.Module, object]:
    """The policy and its tokenizer (carrying the processor), the vision side frozen as configured."""
    compat.apply()
    if cfg.name_or_path == TINY_VLM:
        t = cfg.tiny_vlm
        tokenizer = build_vision_tokenizer(t.family)
        model, processor = build_tiny_vlm(
            tokenizer,
            t.family,
            t.hidden_size,
            t.num_layers,
            t.num_heads,
            t.vision_layers,
            t.image_size,
            t.patch_size,
            t.init_seed,
        )
        if dtype != "auto":
            model = model.to(dtype)
    else:
        processor = AutoProcessor.from_pretrained(source)
        model = AutoModelForImageTextToText.from_pretrained(source, dtype=dtype)
        tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    attach_processor(tokenizer, processor)
    if freezes_vision(cfg):
        freeze_vision(model)
    return model, tokenizer


def load_vision_processor(cfg: ModelConfig, source: str | None) -> tuple[object, int | None]:
    """The tokenizer (carrying the processor) and context length, without the weights: enough to
    check the prompts and their images before the model loads."""
    compat.apply()
    if cfg.name_or_path == TINY_VLM:
        t = cfg.tiny_vlm
        tokenizer = build_vision_tokenizer(t.family)
        attach_processor(tokenizer, build_tiny_processor(tokenizer, t.family, t.image_size, t.patch_size))
        return tokenizer, TINY_VLM_CONTEXT
    processor = AutoProcessor.from_pretrained(source)
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    attach_processor(tokenizer, processor)
    config = AutoConfig.from_pretrained(source)
    text = getattr(config, "text_config", config)
    return tokenizer, getattr(text, "max_position_embeddings", None)
