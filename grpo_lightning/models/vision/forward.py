"""The training passes' forward for a vision-language policy: float32 log-probs of completion tokens.

:class:`~grpo_lightning.models.forward.CompletionLogProbs` hands a micro-batch here when it
carries images. The input embeddings and positions come from :func:`embed_inputs` (the same
function the engine's prefill uses), then the text decoder and the output head, a chunk of rows
at a time as for a text model.

Under FSDP2 the pass runs as the root module's forward (:func:`through_root`), so the root unit's
parameters are gathered and their gradients reduced. Packing (``algorithm.pack_sequences``) works
on image sequences too (not yet under FSDP): the embeddings and the
positions are packed with the ids (:attr:`PackedMicroBatch.dest`), and 3-D positions travel as
``[4, rows, width]``: a text row restarting at 0 per sequence, from which transformers builds the
block-diagonal mask, then the three multimodal rows (packed 3-D positions alone would leave the
mask causal across sequences). As for text, a probe checks once that packed and padded log-probs
agree; a model that fails it runs padded, with a warning.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from grpo_lightning.algorithm.logprobs import TokenLogProbs, lm_head_log_probs, selective_log_probs
from grpo_lightning.algorithm.packing import PackedMicroBatch, pack_layout, scatter_completion
from grpo_lightning.algorithm.truncation import Truncation
from grpo_lightning.models.lora import is_peft_model
from grpo_lightning.models.sharding import is_sharded, through_root
from grpo_lightning.models.vision.families import VisionFamily, family_of
from grpo_lightning.models.vision.features import FeatureCache, embed_inputs
from grpo_lightning.records import CapturedRows, VarLen, VisionInputs

PROBE_TOLERANCE = 1e-4  # mean |packed - padded| in float32: summation order only (see models/forward.py)


def plain_model(model: nn.Module) -> nn.Module:
    """The Hugging Face VLM itself: a LoRA policy's base model (its adapters run in place)."""
    return model.get_base_model() if is_peft_model(model) else model


class VisionLogProbs:
    """Log-probs [B, C] of a micro-batch's completion tokens under a VLM, padded or packed.

    ``chunk_rows(vocab, device, head)`` sizes the output head's chunks (the text forward's budget).
    """

    def __init__(self, chunk_rows, kernels: bool = True):
        self.chunk_rows = chunk_rows
        self.kernels = kernels
        self.cache = FeatureCache()
        self.packing_verified: bool | None = None
        self.last_padding_share: float | None = None

    def __call__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_width: int,
        temperature: float,
        rows: list[VisionInputs | None],
        with_entropy: bool = False,
        entropy_grad: bool = False,
        truncation: Truncation | None = None,
        pack: bool = False,
        capture: list[CapturedRows] | None = None,
    ) -> TokenLogProbs:
        """``capture``, a list that gets the pass's :class:`CapturedRows` (a plain linear head only): the
        final hidden states that predict a completion token, for a distillation divergence."""
        model = plain_model(model)
        family = family_of(model)
        pack = pack and not is_sharded(model)  # the probe would run outside the sharded root's forward
        if pack and self.packing_verified is None:
            self.packing_verified = self._probe(model, family)
        args = (temperature, with_entropy, entropy_grad, truncation)

        def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TokenLogProbs:
            embeds, positions = embed_inputs(model, family, input_ids, attention_mask, prompt_width, rows, self.cache)
            if pack and self.packing_verified and bool(attention_mask[:, prompt_width:].any()):
                packed = (input_ids, attention_mask, prompt_width, embeds, positions)
                return self._packed(model, family, *packed, *args, capture=capture)
            lm = family.language_model(model)
            hidden = lm(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=positions, use_cache=False)
            hidden = hidden.last_hidden_state[:, prompt_width - 1 : -1]
            if capture is not None:
                valid = attention_mask[:, prompt_width:].bool()
                _capture(model, capture, hidden[valid], valid)
            return self._head(model, hidden, input_ids[:, prompt_width:], *args)

        return through_root(model, forward, input_ids, attention_mask)  # FSDP2: the root unit gathered

    def _head(self, model, hidden, targets, temperature, with_entropy, entropy_grad, truncation) -> TokenLogProbs:
        head = model.get_output_embeddings()
        if isinstance(head, nn.Linear) and not getattr(model.config, "final_logit_softcapping", None):
            rows = self.chunk_rows(head.out_features, hidden.device, head)
            return lm_head_log_probs(
                hidden, head, targets, temperature, rows, with_entropy, entropy_grad, truncation, self.kernels
            )
        logits = head(hidden)
        rows = self.chunk_rows(logits.shape[-1], logits.device)
        return selective_log_probs(logits, targets, temperature, rows, with_entropy, entropy_grad, truncation)

    def _packed(
        self,
        model: nn.Module,
        family: VisionFamily,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_width: int,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        *args,
        capture: list[CapturedRows] | None = None,
    ) -> TokenLogProbs:
        valid = attention_mask.bool()
        packed = pack_layout(VarLen.from_padded(input_ids, valid), valid[:, prompt_width:])
        self.last_padding_share = packed.padding_share
        rows, width = packed.input_ids.shape
        flat = embeds.new_zeros(rows * width, embeds.shape[-1]).index_put((packed.dest,), embeds[valid])
        position_ids = packed.position_ids
        if positions.dim() == 3:  # [4, rows, width]: the restarting text row, then the 3-D rows
            spatial = positions.new_zeros(3, rows * width)
            spatial[:, packed.dest] = positions[:, valid]
            position_ids = torch.cat([position_ids[None], spatial.view(3, rows, width)])
        lm = family.language_model(model)
        hidden = lm(
            inputs_embeds=flat.view(rows, width, -1), position_ids=position_ids, attention_mask=None, use_cache=False
        ).last_hidden_state
        chosen = hidden.reshape(-1, hidden.shape[-1])[packed.source][None]
        if capture is not None:
            _capture(model, capture, chosen[0], packed.completion_valid)
        out = self._head(model, chosen, packed.targets[None], *args)
        return _scattered(out, packed)

    @torch.no_grad()
    def _probe(self, model: nn.Module, family: VisionFamily) -> bool:
        """Packed and padded log-probs of three random text sequences agree (two share a packed row)."""
        vocab = model.get_input_embeddings().num_embeddings
        device = model.get_input_embeddings().weight.device
        ids = torch.randint(0, vocab, (3, 12), generator=torch.Generator().manual_seed(0)).to(device)
        ids[ids == model.config.image_token_id] = 0
        mask = torch.ones(3, 12, dtype=torch.long, device=device)
        mask[1, :3], mask[1, 8:] = 0, 0
        mask[2, :4], mask[2, 10:] = 0, 0
        was_training = model.training
        model.eval()
        try:
            embeds, positions = embed_inputs(model, family, ids, mask, 6, [None] * 3, self.cache)
            got = self._packed(model, family, ids, mask, 6, embeds, positions, 1.0, False, False, None).logp
            lm = family.language_model(model)
            hidden = lm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).last_hidden_state
            want = self._head(model, hidden[:, 5:-1], ids[:, 6:], 1.0, False, False, None).logp
        finally:
            model.train(was_training)
        diff = float((got - want)[mask[:, 6:].bool()].abs().mean())
        if diff <= PROBE_TOLERANCE or model.get_input_embeddings().weight.dtype != torch.float32 and diff <= 0.05:
            return True
        warnings.warn(
            f"algorithm.pack_sequences: packed and padded log-probs of {type(model).__name__} differ by {diff:.3g} "
            "nats on average: its attention does not restart at packed positions. Training runs padded; set "
            "algorithm.pack_sequences=false to silence this.",
            stacklevel=3,
        )
        return False


def _capture(model: nn.Module, capture: list[CapturedRows], rows: torch.Tensor, valid: torch.Tensor) -> None:
    """The rows that predict a completion token, for a divergence; nothing without a plain linear head."""
    head = model.get_output_embeddings()
    if isinstance(head, nn.Linear) and not getattr(model.config, "final_logit_softcapping", None):
        capture.append(CapturedRows(rows, valid, head))


def _scattered(out: TokenLogProbs, packed: PackedMicroBatch) -> TokenLogProbs:
    valid = packed.completion_valid
    return TokenLogProbs(
        logp=scatter_completion(out.logp[0], valid, 0.0),
        entropy=scatter_completion(out.entropy[0], valid, 0.0) if out.entropy is not None else None,
        finite=scatter_completion(out.finite[0], valid, True),
    )
