"""The HF engine's prefill and one-token steps for a vision-language policy.

The prefill builds the prompts' input embeddings and positions with
:func:`~grpo_lightning.models.vision.features.embed_inputs`, the function every training pass
uses, so the engine and the trainer see the same pixels at the same positions; the features of
a group's prompt are computed once for its G samples (:class:`FeatureCache`, shared by the chunks
of one generate call), and so is its prefill: each distinct row (the same ids and the same images)
runs through the decoder once, its keys, values and logits copied to the rows repeating it. Each
step feeds the sampled token as text at the next position: one past the largest position so far,
the same on every axis of 3-D positions (Qwen2-VL's rule for text).

A family with text positions and a Llama-family text decoder (LLaVA's) decodes with the fused
decoder of :mod:`grpo_lightning.rollout.fused_decode` (``rollout.hf_decoder=fused``, the default)
where it supports the model: the same layers from the model's own weights, prefilled from the
embeddings above, a fraction of the forward's per-token overhead.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from grpo_lightning.models.lora import is_peft_model
from grpo_lightning.models.sharding import is_sharded, through_root
from grpo_lightning.models.vision.families import VisionFamily, family_of
from grpo_lightning.models.vision.features import FeatureCache, embed_inputs
from grpo_lightning.models.vision.forward import plain_model
from grpo_lightning.records import VisionInputs
from grpo_lightning.rollout.fused_decode import FusedDecoder, FusedWeights, fused_decode_support, shared_rows

# The causal-LM class a VLM's text decoder stands for (its text config's model type).
CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


class TextView:
    """A VLM's text decoder and output head, as the fused decoder reads a causal LM (``.model``, ``.lm_head``)."""

    def __init__(self, model: nn.Module, family: VisionFamily):
        self.model, self.lm_head = family.language_model(model), model.get_output_embeddings()
        self.config, self.device = self.model.config, self.lm_head.weight.device
        self.architecture = CAUSAL_LM.get(getattr(self.config, "model_type", None), "unknown")

    def parameters(self):
        yield from self.model.parameters()
        yield from self.lm_head.parameters()


def fused_text_decoder(model: nn.Module, mask: torch.Tensor, max_steps: int) -> FusedDecoder | None:
    """The fused decoder over ``model``'s text decoder (``mask``: the prompts'), or None where it does not apply."""
    plain = plain_model(model)
    family = family_of(plain)
    if family.multimodal_positions or is_peft_model(model) or is_sharded(model):
        return None
    view = TextView(plain, family)
    if fused_decode_support(view, mask.shape[1] + max_steps, view.architecture) is not None:
        return None
    return FusedDecoder(view, mask, max_steps, FusedWeights(view))


class VisionDecoder:
    """``prefill(prompt_ids)`` then ``step(tokens)``, each returning the next token's logits [B, V]."""

    def __init__(
        self,
        model: nn.Module,
        mask: torch.Tensor,
        rows: list[VisionInputs | None],
        cache: FeatureCache,
        fused: FusedDecoder | None = None,
    ):
        self.fused = fused  # decodes the text from the prefill's embeddings on, where it applies
        self.model = plain_model(model)
        self.family = family_of(self.model)
        self.decoder = self.family.language_model(self.model)
        self.head = self.model.get_output_embeddings()
        self.mask, self.rows, self.features = mask, rows, cache
        self.kv = DynamicCache()
        self.last: torch.Tensor | None = None  # [B] each row's largest position so far

    def _logits(self, embeds: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.decoder(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.kv,
            use_cache=True,
        ).last_hidden_state[:, -1]
        return self.head(hidden)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return through_root(self.model, self._prefill, prompt_ids)  # FSDP2: the root unit gathered

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.fused.step(tokens)
        return through_root(self.model, self._step, tokens)

    def _prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        # A group's G rows are one prompt with the same images: each distinct row is prefilled once.
        images = [id(v) if v is not None else None for v in self.rows]
        keys = zip(prompt_ids.tolist(), self.mask.tolist(), images, strict=True)
        shared = shared_rows([(tuple(ids), tuple(mask), v) for ids, mask, v in keys], prompt_ids.device)
        ids, mask, rows = prompt_ids, self.mask, self.rows
        if shared is not None:
            ids, mask = prompt_ids[shared.firsts], self.mask[shared.firsts]
            rows = [self.rows[i] for i in shared.firsts.tolist()]
        embeds, positions = embed_inputs(self.model, self.family, ids, mask, ids.shape[1], rows, self.features)
        spatial = positions if positions.dim() == 3 else positions[None]
        self.last = spatial.amax(dim=(0, 2))
        if shared is not None:
            self.last = self.last[shared.inverse]
        if self.fused is not None:
            return self.fused.prefill_embeddings(embeds, shared)
        logits = self._logits(embeds, positions, mask)
        if shared is None:
            return logits
        self.kv.batch_select_indices(shared.inverse)  # each distinct row's keys and values to the rows repeating it
        return logits[shared.inverse]

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        self.last = self.last + 1
        positions = self.last[:, None]
        if self.family.multimodal_positions:
            positions = positions[None].expand(3, -1, -1)
        return self._logits(self.model.get_input_embeddings()(tokens[:, None]), positions, self.mask)
