"""What differs between vision-language model families, behind one interface: :class:`VisionFamily`.

Every pass of a run (the engine's prefill and decode, the reference, old and policy log-probs)
builds a sequence's input embeddings the same way: the text embeddings, with each prompt's image
features written over its image tokens, and its positions from the family's rule. A family says
how its images become features, how its positions run (1-D for LLaVA, 3-D multimodal rotary
positions for Qwen2-VL), which modules are its vision side (frozen by ``model.freeze_vision``)
and what vLLM calls its weights. A family is one registered file (``qwen2_vl.py``, ``llava.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from grpo_lightning.errors import ConfigError
from grpo_lightning.records import VisionInputs
from grpo_lightning.registry import Registry


class VisionFamily:
    """The family-specific parts; subclasses implement the methods, registered in :data:`VISION_FAMILIES`."""

    model_types: tuple[str, ...] = ()  # config.model_type values of the family
    vision_prefixes: tuple[str, ...] = ()  # parameter-name prefixes of the vision side (tower and projector)
    # Positions are 3-D (temporal, height, width: multimodal rotary positions) rather than 1-D.
    multimodal_positions = False

    def image_features(self, model: nn.Module, inputs: list[VisionInputs]) -> list[torch.Tensor]:
        """Each prompt's image features [its image tokens, hidden], one vision forward for all of them."""
        raise NotImplementedError

    def positions(
        self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, image_mask: torch.Tensor, rows: list
    ) -> torch.Tensor:
        """Position ids of ``ids`` [B, T] (real tokens where ``mask``): [B, T], or [3, B, T] for 3-D positions.

        ``image_mask`` marks the prompt's image tokens (an image token the policy sampled in its
        completion is text); ``rows``: each row's :class:`VisionInputs` or None."""
        return (mask.long().cumsum(dim=1) - 1).clamp(min=0)

    def image_tokens(self, config, inputs: VisionInputs) -> list[int]:
        """Image tokens of each image of a prompt (images may sit side by side, one run of tokens);
        ``config`` the model's.

        By default the images share the prompt's image tokens equally (a fixed-size tower)."""
        return [inputs.num_image_tokens // inputs.num_images] * inputs.num_images

    def language_model(self, model: nn.Module) -> nn.Module:
        """The text decoder: input embeddings and positions in, last hidden states out."""
        return model.model.language_model

    def engine_name(self, name: str) -> str:
        """The name vLLM's loader takes for the policy's parameter ``name``."""
        return name


# model_type -> family (each family registers under its own name and lists its model types).
VISION_FAMILIES: Registry[VisionFamily] = Registry("vision-language model family", "model.name_or_path")


def image_token_id(model_or_config) -> int:
    config = getattr(model_or_config, "config", model_or_config)
    return int(config.image_token_id)


def is_vision_config(config) -> bool:
    """A config with a vision tower (a vision-language model) rather than a text-only one."""
    return getattr(config, "vision_config", None) is not None


def family_of(model_or_config) -> VisionFamily:
    """The family of a vision-language model or config; ConfigError for a family not supported."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    for family in VISION_FAMILIES.entries.values():
        if model_type in family.model_types:
            return family
    supported = sorted(t for family in VISION_FAMILIES.entries.values() for t in family.model_types)
    raise ConfigError(
        f"vision-language model type {model_type!r} is not supported; supported model types: {supported} "
        "(docs/vision.md says what a family needs)"
    )


def split_per_prompt(features: list[torch.Tensor], inputs: list[VisionInputs]) -> list[torch.Tensor]:
    """Per-image features grouped into each prompt's ([its image tokens, hidden])."""
    out, start = [], 0
    for v in inputs:
        images = features[start : start + v.num_images]
        out.append(torch.cat(list(images), dim=0) if images else features[0].new_zeros(0, features[0].shape[-1]))
        start += v.num_images
    return out


def cat_tensor(inputs: list[VisionInputs], name: str) -> torch.Tensor:
    return torch.cat([v.tensors[name] for v in inputs], dim=0)
