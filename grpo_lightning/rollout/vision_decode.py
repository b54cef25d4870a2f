"""The HF engine's prefill and one-token steps for a vision-language policy.

The prefill builds the prompts' input embeddings and positions with
:func:`~grpo_lightning.models.vision.features.embed_inputs`, the function every training pass
uses, so the engine and the trainer see the same pixels at the same positions; the features of
a group's prompt are computed once for its G samples (:class:`FeatureCache`, shared by the chunks
of one generate call). Each step feeds the sampled token as text at the next position: one past
the largest position so far, the same on every axis of 3-D positions (Qwen2-VL's rule for text).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from grpo_lightning.models.vision.families import family_of
from grpo_lightning.models.vision.features import FeatureCache, embed_inputs
from grpo_lightning.models.vision.forward import plain_model
from grpo_lightning.records import VisionInputs


class VisionDecoder:
    """``prefill(prompt_ids)`` then ``step(tokens)``, each returning the next token's logits [B, V]."""

    def __init__(self, model: nn.Module, mask: torch.Tensor, rows: list[VisionInputs | None], cache: FeatureCache):
        self.model = plain_model(model)
        self.family = family_of(self.model)
        self.decoder = self.family.language_model(self.model)
        self.head = self.model.get_output_embeddings()
        self.mask, self.rows, self.features = mask, rows, cache
        self.kv = DynamicCache()
        self.last: torch.Tensor | None = None  # [B] each row's largest position so far

    def _logits(self, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.decoder(
            inputs_embeds=embeds,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.kv,
            use_cache=True,
        ).last_hidden_state[:, -1]
        return self.head(hidden)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        embeds, positions = embed_inputs(
            self.model, self.family, prompt_ids, self.mask, prompt_ids.shape[1], self.rows, self.features
        )
        spatial = positions if positions.dim() == 3 else positions[None]
        self.last = spatial.amax(dim=(0, 2))
        return self._logits(embeds, positions)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        self.last = self.last + 1
        positions = self.last[:, None]
        if self.family.multimodal_positions:
            positions = positions[None].expand(3, -1, -1)
        return self._logits(self.model.get_input_embeddings()(tokens[:, None]), positions)
