"""``VisionInputs``: the images of one prompt as every pass needs them, computed once per prompt.

The processor turns a prompt's images into tensors (``pixel_values``, and for Qwen2-VL
``image_grid_thw``) and expands each image into a run of image tokens in the prompt's ids. The
G samples of a group share one ``VisionInputs`` object: the rollout, the reference, old and
policy passes read the same tensors, so every pass sees exactly the pixels the engine saw.
``key`` is the prompt's image identity (content hashes), part of the prompt's identity wherever
prompts are compared (health fingerprints, dynamic sampling, tables). Imports only torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(eq=False)
class VisionInputs:
    """One prompt's images: their processor tensors, identities and the image tokens they expand to."""

    key: str  # the images' identity: their content hashes, in order
    refs: list[str]  # per image: its path, or its content hash when it has none (tables, completions.jsonl)
    tensors: dict[str, torch.Tensor]  # the processor's image tensors (pixel_values, image_grid_thw, ...)
    num_image_tokens: int  # image tokens of the prompt's ids: the features the images must fill
    images: list[Any] = field(default_factory=list)  # the decoded images (PIL), for the engine and the tables
    # Where the images go: each image token's index in the row's own sequence (its first prompt token is 0,
    # the completion follows the prompt). None: every image token of the prompt (a processed prompt). An
    # episode's images arrive in environment replies, after sampled ids that may hold image tokens (text).
    slots: tuple[int, ...] | None = None

    @property
    def num_images(self) -> int:
        return len(self.refs)

    def to(self, device: torch.device | str) -> VisionInputs:
        """The same inputs with their tensors on ``device`` (itself when they are there already)."""
        if all(t.device == torch.device(device) for t in self.tensors.values()):
            return self
        moved = {name: t.to(device) for name, t in self.tensors.items()}
        return VisionInputs(self.key, self.refs, moved, self.num_image_tokens, self.images, self.slots)


def moved(vision: list[VisionInputs | None] | None, device) -> list[VisionInputs | None] | None:
    """``vision`` (one entry per sequence) on ``device``; an object shared by rows is moved once."""
    if vision is None:
        return None
    done: dict[int, VisionInputs] = {}
    out = []
    for v in vision:
        if v is None:
            out.append(None)
            continue
        if id(v) not in done:
            done[id(v)] = v.to(device)
        out.append(done[id(v)])
    return out
