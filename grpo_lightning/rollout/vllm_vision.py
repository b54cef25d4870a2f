"""vLLM with a vision-language policy: the same token-in/token-out contract as text.

* **Prompts.** The trainer's prompt ids hold each image expanded into its run of image tokens.
  vLLM expands images itself, so each run goes in as one image token with the images as
  ``multi_modal_data``; the ids vLLM reports back after its own expansion must be the trainer's,
  or the engine stops (different image-processor settings would put the features at other places).
* **Weights.** vLLM's loader takes the names of the Hub's checkpoints; a family renames where
  transformers 5 differs (LLaVA's tower, :meth:`VisionFamily.engine_name`), in the engine's first
  folder and in every sync. A frozen vision side is pushed once: it never changes.
* **Caches.** vLLM keeps image embeddings in an encoder cache keyed by the image alone: after a
  sync that may change the tower, the cache is reset with the prefix cache, or old features of a
  seen image would be reused.
* **Without torchvision** (this project's CPU setup): vLLM's model files import helpers from
  transformers' torchvision-backed image-processing modules; :mod:`grpo_lightning.models.vision.compat`
  aliases them to the PIL ones, and the families' vLLM classes are registered in this process (vLLM
  would inspect them in a fresh interpreter, without the aliases). The Qwen2-VL family's processing in
  vLLM needs transformers' video processor, which needs torchvision: it is refused, in one line.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.lora import is_peft_model, merged_state_dict
from grpo_lightning.models.vision import compat
from grpo_lightning.models.vision.families import VisionFamily, family_of, is_vision_config
from grpo_lightning.rollout.engine import Completion, EngineError, GenerationRequest

# architecture -> vLLM module, registered in this process when torchvision is missing.
VLLM_CLASSES = {"LlavaForConditionalGeneration": "llava"}
NEEDS_TORCHVISION = ("qwen2_vl", "qwen2_5_vl")


def is_vision_policy(policy) -> bool:
    return is_vision_config(getattr(policy, "config", None))


def refuse_unsupported(model_type: str | None, rollout=None) -> None:
    """ConfigError, before the model loads (and at the engine's start), for what vLLM cannot do here with a
    vision-language policy of ``model_type`` (None: a text policy, nothing to refuse)."""
    if model_type is None:
        return
    if model_type in NEEDS_TORCHVISION and not compat.torchvision_installed():
        raise ConfigError(
            f"rollout.engine=vllm: vLLM 0.32 processes {model_type} images with transformers' video processor, "
            "which needs torchvision (uninstalled here, docs/vllm.md); use rollout.engine=hf, a LLaVA-family "
            "model, or install the CPU build of torchvision that matches torch"
        )
    if rollout is not None and rollout.mode == "async":
        raise ConfigError(
            "rollout.mode=async: a vision-language policy generates synchronously only (its queued requests "
            "carry images, which a checkpoint of the generations in flight cannot hold yet); set rollout.mode=sync"
        )
    if rollout is not None and (rollout.uses_server or not rollout.vllm.in_process):
        raise ConfigError(
            "rollout.vllm: a vision-language policy runs on the in-process vLLM engine only (its images reach a "
            "server or an engine process by no path here yet, docs/vision.md); set rollout.vllm.in_process=true "
            "without rollout.vllm.server, or rollout.engine=hf"
        )


def prepare_vllm(policy) -> None:
    """Make vLLM able to load ``policy``'s family here; ConfigError for a family it cannot run without torchvision."""
    refuse_unsupported(getattr(policy.config, "model_type", None))
    if compat.torchvision_installed():
        return
    compat.apply()
    from vllm import ModelRegistry  # noqa: PLC0415 - vLLM loads only with rollout.engine=vllm

    for arch, module in VLLM_CLASSES.items():
        ModelRegistry.register_model(
            arch, getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), arch)
        )


def engine_names(policy, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``tensors`` under the names vLLM's loader takes (a text policy's as they are)."""
    if not is_vision_policy(policy):
        yield from tensors
        return
    family = family_of(policy)
    for name, tensor in tensors:
        yield family.engine_name(name), tensor


def frozen_vision_names(policy) -> set[str]:
    """The vision-side weights that never change (frozen, no adapter): pushed with the first sync only."""
    if not is_vision_policy(policy) or is_peft_model(policy):
        return set()
    prefixes = family_of(policy).vision_prefixes
    return {n for n, p in policy.named_parameters() if n.startswith(prefixes) and not p.requires_grad}


def write_engine_weights(policy, folder: str | Path) -> None:
    """The engine's folder holds the weights under vLLM's names (one safetensors file)."""
    folder = Path(folder)
    for old in [*folder.glob("*.safetensors"), *folder.glob("*.safetensors.index.json")]:
        old.unlink()
    state = {name: t.detach().contiguous() for name, t in engine_names(policy, merged_state_dict(policy).items())}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def collapsed(ids: list[int], image_token: int, counts: list[int]) -> list[int]:
    """One image token per image, ``counts`` the image tokens of each image in order (images side by
    side make one run of tokens): vLLM expands every image itself."""
    out, index, pending = [], 0, 0
    for token in ids:
        if token != image_token:
            out.append(token)
            continue
        if pending == 0:
            if index >= len(counts):
                raise EngineError(f"a prompt holds more image tokens than its {len(counts)} image(s) fill")
            out.append(token)
            pending = counts[index]
            index += 1
        pending -= 1
    return out


@dataclass(frozen=True)
class EngineVision:
    """What an engine needs to know of a vision-language policy to build its prompts."""

    image_token_id: int
    family: VisionFamily
    config: Any  # the policy's config

    @classmethod
    def of(cls, policy) -> EngineVision | None:
        if not is_vision_policy(policy):
            return None
        return cls(int(policy.config.image_token_id), family_of(policy), policy.config)

    def prompt(self, request: GenerationRequest):
        """The vLLM prompt of a request: its ids, with its images as multimodal data where it has some."""
        from vllm.inputs import TokensPrompt  # noqa: PLC0415 - vLLM loads only with rollout.engine=vllm

        vision = request.vision
        if vision is None or not vision.num_images:
            return TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        counts = self.family.image_tokens(self.config, vision)
        return TokensPrompt(
            prompt_token_ids=collapsed(list(request.prompt_ids), self.image_token_id, counts),
            multi_modal_data={"image": vision.images if vision.num_images > 1 else vision.images[0]},
        )


def checked_prompt(request: GenerationRequest, engine_ids: list[int], completion: Completion) -> Completion:
    """The completion, once vLLM's expansion of the prompt is the trainer's (token in, token out)."""
    if request.vision is not None and list(engine_ids) != list(request.prompt_ids):
        raise EngineError(
            f"vLLM expanded a prompt's {request.vision.num_images} image(s) into {len(engine_ids)} prompt tokens, "
            f"the trainer's processor into {len(request.prompt_ids)}: the two image processors' settings differ "
            "(e.g. min_pixels / max_pixels); the engine's folder must hold the policy's processor"
        )
    return completion
