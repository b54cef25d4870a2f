"""A VLM's input embeddings and positions, the one way every pass builds them.

The engine's prefill, and the reference, old and policy passes all call :func:`embed_inputs`: the
text embeddings with each prompt's image features written over the prompt's image tokens, and the
family's positions. So every pass sees the pixels the engine saw, at the positions it saw them.

Image features are computed once per prompt, not once per sample: the G rows of a group share
their prompt's :class:`~grpo_lightning.records.VisionInputs`, and :class:`FeatureCache` runs the
vision side once for the distinct prompts of a call. Features that need no gradient (a pass without
one, or a frozen vision side) are also kept across calls while the vision weights that made them
are unchanged: a frozen tower's features are computed once per prompt per step, and shared by the
reference (which shares the frozen tower) and every pass of the policy.
"""

from __future__ import annotations

import torch
from torch import nn

from grpo_lightning.models.vision.families import VisionFamily, image_token_id
from grpo_lightning.records import VisionInputs


class FeatureCache:
    """Image features of prompts, reused while they need no gradient and the vision weights are unchanged."""

    def __init__(self, max_prompts: int = 2048):
        self.max_prompts = max_prompts
        self._kept: dict[tuple, torch.Tensor] = {}
        self.computed = 0  # prompts whose features were computed (a test counts them)

    def features(self, model: nn.Module, family: VisionFamily, inputs: list[VisionInputs]) -> list[torch.Tensor]:
        """Features of each entry of ``inputs`` (entries may repeat: computed once per distinct one)."""
        vision = [p for name, p in model.named_parameters() if name.startswith(family.vision_prefixes)]
        keep = not (torch.is_grad_enabled() and any(p.requires_grad for p in vision))
        # Identity of the weights: their tensors and in-place version counters (an optimizer step bumps them).
        weights = tuple((id(p), p._version) for p in vision)
        found: dict[int, torch.Tensor] = {}
        missing: list[VisionInputs] = []
        for v in inputs:
            if id(v) in found or any(m is v for m in missing):
                continue
            cached = self._kept.get((weights, v.key)) if keep else None
            if cached is not None:
                found[id(v)] = cached
            else:
                missing.append(v)
        if missing:
            computed = family.image_features(model, missing)
            self.computed += len(missing)
            for v, value in zip(missing, computed, strict=True):
                found[id(v)] = value
                if keep:
                    self._kept[(weights, v.key)] = value
            while len(self._kept) > self.max_prompts:
                del self._kept[next(iter(self._kept))]
        return [found[id(v)] for v in inputs]

    def clear(self) -> None:
        self._kept.clear()


def prompt_image_mask(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, prompt_width: int, rows: list[VisionInputs | None]
) -> torch.Tensor:
    """[B, T] the image tokens the rows' images fill: the prompts' (an image token sampled in a completion is
    text), or where a row's ``slots`` say (an episode's images, in its environment replies too)."""
    image = (ids == image_token_id(model)) & mask.bool()
    image[:, prompt_width:] = False
    for i, v in enumerate(rows):
        if v is None or v.slots is None:
            continue
        image[i] = False
        if not v.slots:
            continue
        # Prompts are left-padded to prompt_width, completions follow it: a slot's column in the padded row.
        length = int(mask[i, :prompt_width].sum())
        slots = torch.tensor(v.slots, dtype=torch.long, device=ids.device)
        columns = torch.where(slots < length, prompt_width - length + slots, prompt_width + slots - length)
        columns = columns[columns < ids.shape[1]]  # the engine's requests hold the slots of their prefix only
        image[i, columns] = ids[i, columns] == image_token_id(model)
    return image


def embed_inputs(
    model: nn.Module,
    family: VisionFamily,
    ids: torch.Tensor,
    mask: torch.Tensor,
    prompt_width: int,
    rows: list[VisionInputs | None],
    cache: FeatureCache,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input embeddings [B, T, H] with the rows' image features in place, and their positions.

    ``model`` is the plain Hugging Face VLM (a LoRA policy's base model), ``rows`` each row's
    images (None: a text-only row), columns from ``prompt_width`` on the completion.
    """
    embeds = model.get_input_embeddings()(ids)
    image = prompt_image_mask(model, ids, mask, prompt_width, rows)
    with_images = [i for i, v in enumerate(rows) if v is not None and v.num_images]
    counts = image.sum(dim=1).tolist()
    for i, v in enumerate(rows):
        expected = v.num_image_tokens if v is not None else 0
        if counts[i] != expected:
            raise ValueError(
                f"row {i} has {counts[i]} image tokens in its prompt but its images fill {expected}: the prompt's "
                "image tokens were cut or its images changed after the processor ran"
            )
    if with_images:
        features = cache.features(model, family, [rows[i] for i in with_images])
        source = torch.cat(features, dim=0).to(embeds.dtype)
        embeds = embeds.masked_scatter(image[..., None], source)
    return embeds, family.positions(model, ids, mask, image, rows)
