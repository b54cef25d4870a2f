"""Images in an episode: a picture an environment returns in a message, for a vision-language policy.

An environment's ``reset`` or ``step`` may return a message whose content is a list of parts,
``{"type": "text", "text": ...}`` and ``{"type": "image", "image": picture}``, the picture in any
form a dataset row's image takes (a PIL image, bytes, a path, a ``data:image/...`` URI, a
``datasets`` Image dict: ``data/images.py`` loads it). The runner renders the message with the chat
template (the part without its picture), and the processor expands each image token into its run
(:meth:`EpisodeImages.expand`): the ids of the reply, loss mask 0 as every environment token,
and the image's tensors. An episode's images accumulate in :class:`EpisodeVision`: every turn's
request to the engine and the episode's row of the batch carry them as one
:class:`~grpo_lightning.records.VisionInputs` whose ``slots`` say which tokens are image slots (an
image token the model sampled stays text), so the engine and every training pass put the same
features at the same places.

A picture the policy cannot take ends the run in one line naming the environment and the turn:
any picture for a text-only policy, one Pillow cannot read, or more pictures in an episode than
``rollout.vllm.images_per_prompt``. A reply whose image tokens leave no room for another turn is
not appended (the episode stops with ``context`` or ``max_total_tokens``): an image is never cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import UnidentifiedImageError

from grpo_lightning.data.images import describe, image_hash, load_image, ref_name
from grpo_lightning.data.vision_prompting import TEXT_KEYS, _image_token
from grpo_lightning.environments.base import Message
from grpo_lightning.environments.returns import EnvironmentReturnError
from grpo_lightning.errors import ConfigError
from grpo_lightning.records import VisionInputs


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image"


def message_images(messages: list[Message]) -> list[Any]:
    """The pictures of ``messages``' image parts, in order."""
    return [
        p.get("image") for m in messages if isinstance(m.get("content"), list) for p in m["content"] if is_image_part(p)
    ]


def template_messages(messages: list[Message]) -> list[Message]:
    """``messages`` as the chat template reads them: image parts without their picture."""
    if not message_images(messages):
        return messages
    return [
        {**m, "content": [{"type": "image"} if is_image_part(p) else p for p in m["content"]]}
        if isinstance(m.get("content"), list)
        else m
        for m in messages
    ]


def recorded_messages(messages: list[Message], names: list[str]) -> list[Message]:
    """``messages`` with each picture replaced by its name (a path, or ``sha:`` its pixel hash): what the
    conversation keeps for the rewards, completions.jsonl and the tables."""
    if not names:
        return messages
    it = iter(names)
    return [
        {**m, "content": [{"type": "image", "image": next(it)} if is_image_part(p) else p for p in m["content"]]}
        if isinstance(m.get("content"), list)
        else m
        for m in messages
    ]


@dataclass
class EpisodeVision:
    """An episode's pictures so far, their tensors, and the indices of their image tokens in its sequence."""

    images: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    tensors: list[dict[str, torch.Tensor]] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    _inputs: VisionInputs | None = None

    def add(self, start: int, ids: list[int], image_token: int, images: list, names: list[str], tensors: dict) -> None:
        """``images`` expanded into ``ids``, which begin at index ``start`` of the episode's sequence."""
        self.images += images
        self.names += names
        self.tensors.append(tensors)
        self.slots += [start + i for i, token in enumerate(ids) if token == image_token]
        self._inputs = None

    def inputs(self) -> VisionInputs:
        """The pictures as one :class:`VisionInputs` (the same object until another picture arrives)."""
        if self._inputs is None:
            keys = self.tensors[0].keys() if self.tensors else ()
            self._inputs = VisionInputs(
                key="|".join(image_hash(i) for i in self.images),
                refs=list(self.names),
                tensors={k: torch.cat([t[k] for t in self.tensors]) for k in keys},
                num_image_tokens=len(self.slots),
                images=list(self.images),
                slots=tuple(self.slots),
            )
        return self._inputs


class EpisodeImages:
    """Loads an environment's pictures and expands them with the policy's processor (None: a text policy)."""

    def __init__(self, processor: Any, max_images: int | None = None):
        self.processor, self.max_images = processor, max_images
        self.image_token_id = (
            int(processor.tokenizer.convert_tokens_to_ids(_image_token(processor))) if processor is not None else None
        )

    def load(self, refs: list, where: str, method: str, already: int) -> tuple[list, list[str]]:
        """The pictures ``method`` returned (``where`` names the environment, the call and the turn), the
        episode holding ``already``, and their names."""
        if self.processor is None:
            raise EnvironmentReturnError(
                f"{where} returned {len(refs)} image(s) but the policy is a text-only model; use a vision-language "
                "model (model=tiny_vlm, or the folder of one such as Qwen2-VL or LLaVA) or return text"
            )
        if self.max_images is not None and already + len(refs) > self.max_images:
            raise EnvironmentReturnError(
                f"{where} brings its episode to {already + len(refs)} images, more than "
                f"rollout.vllm.images_per_prompt={self.max_images}; raise it or return fewer images"
            )
        images = []
        for index, ref in enumerate(refs):
            try:
                images.append(load_image(ref))
            except (FileNotFoundError, UnidentifiedImageError, OSError, ValueError, TypeError) as err:
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
                raise EnvironmentReturnError(
                    f"{where}: image {index} ({describe(ref)}) is not a picture Pillow can read: {reason}; fix what "
                    f"its {method}() returns"
                ) from err
        return images, [ref_name(r, i) for r, i in zip(refs, images, strict=True)]

    def expand(self, text: str, images: list, add_special_tokens: bool = False) -> tuple[list[int], dict]:
        """Template text holding one image token per picture -> its ids with each expanded, and the tensors."""
        out = self.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=add_special_tokens)
        tensors = {k: v for k, v in out.items() if k not in TEXT_KEYS and isinstance(v, torch.Tensor)}
        return out["input_ids"][0].tolist(), tensors


def refuse_engine(model_type: str | None, rollout: Any) -> None:
    """ConfigError, before the model loads, for episodes of a vision-language policy (``model_type``; None:
    a text policy) on an engine or mode that does not take an episode's pictures yet."""
    if model_type is None:
        return
    if rollout.engine != "hf" or rollout.mode == "pipeline":
        what = "rollout.mode=pipeline" if rollout.mode == "pipeline" else f"rollout.engine={rollout.engine}"
        raise ConfigError(
            f"{what}: episodes of a vision-language policy ({model_type}) run on rollout.engine=hf in "
            "rollout.mode=sync only (vLLM engines, the vLLM server and pipeline mode do not take an environment's "
            "images yet, docs/environments.md); set rollout.engine=hf rollout.mode=sync"
        )


__all__ = [
    "EpisodeImages",
    "EpisodeVision",
    "message_images",
    "recorded_messages",
    "refuse_engine",
    "template_messages",
]
