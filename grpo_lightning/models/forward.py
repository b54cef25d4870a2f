"""The training passes' forward: float32 log-probs of completion tokens under a model.

One place decides how a micro-batch goes through the decoder: padded as generated, or
packed without padding (``algorithm.pack_sequences``, :mod:`grpo_lightning.algorithm.packing`).
Packing relies on the model building its attention mask from restarting position ids
(transformers does for its sdpa, eager and flash-attention paths). A model that does not
would let tokens attend across sequences and return wrong log-probs without a sound; so
before the first packed pass a probe compares packed and padded log-probs of three short
random sequences, and a model that fails it is run padded, with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from grpo_lightning.algorithm.logprobs import TokenLogProbs, lm_head_log_probs, selective_log_probs
from grpo_lightning.algorithm.packing import PackedMicroBatch, pack_micro_batch, scatter_completion
from grpo_lightning.algorithm.truncation import Truncation
from grpo_lightning.config.algorithm import logprob_chunk_mb
from grpo_lightning.models.sharding import is_sharded
from grpo_lightning.models.vision.forward import VisionLogProbs
from grpo_lightning.records import CapturedRows, VisionInputs

# Mean |packed - padded| log-prob of the probe above which packing is declared broken. Both
# computations see the same tokens; they differ by summation order only: ~1e-6 in float32,
# ~1e-2 in bfloat16. Attention across sequences moves it by far more (~1 nat on random tokens).
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6}
PROBE_TOLERANCE_16BIT = 0.05


def plain_output_head(model: nn.Module) -> nn.Linear | None:
    """The output head if logits are exactly ``head(decoder(x))`` (no soft-capping or scaling)."""
    config = getattr(model, "config", None)
    if is_sharded(model):  # FSDP2: the head's weights are gathered by the root unit's forward only
        return None
    if config is None or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return head if isinstance(head, nn.Linear) and decoder is not None else None


class CompletionLogProbs:
    """Float32 log-probs [B, C] of the completion tokens of a micro-batch, padded or packed.

    ``chunk_mb`` bounds the float32 logits alive at once (``algorithm.logprob_chunk_mb``, a number or auto);
    ``pack`` asks for padding-free passes (verified once by the probe, see the module doc).
    """

    def __init__(self, chunk_mb: float | str, pack: bool, kernels: bool = True):
        self.chunk_mb = chunk_mb
        self.kernels = kernels  # algorithm.head_kernels
        self.pack = pack
        self.packing_verified: bool | None = None  # None: the probe has not run yet
        self.last_padding_share: float | None = None  # of the last packed micro-batch
        self.vision = VisionLogProbs(self._chunk_rows, kernels)  # micro-batches with images (models/vision/)

    def __call__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_width: int,
        temperature: float,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        packed: Callable[[], PackedMicroBatch] | None = None,
        truncation: Truncation | None = None,
        capture: list[CapturedRows] | None = None,
        vision: list[VisionInputs | None] | None = None,
    ) -> TokenLogProbs:
        """``packed``, if given, returns these rows already packed (a micro-batch packs once for all its passes);
        ``truncation``, the engine's top-k / top-p filter to replay (``algorithm.truncated_sampling``);
        ``capture``, a list that gets the pass's :class:`CapturedRows` (models with a plain head only);
        ``vision``, each row's images: the rows of a vision-language policy (:class:`VisionLogProbs`)."""
        if vision is not None:
            out = self.vision(
                model,
                input_ids,
                attention_mask,
                prompt_width,
                temperature,
                vision,
                with_entropy,
                entropy_grad,
                truncation,
                pack=self.pack,
                capture=capture,
            )
            self.last_padding_share = self.vision.last_padding_share
            return out
        if self.pack and self.packing_verified is None:
            self.packing_verified = self._probe(model)
        # A micro-batch without a completion token has nothing to pack (and no graph without one).
        if self.pack and self.packing_verified and bool(attention_mask[:, prompt_width:].any()):
            packed = packed() if packed is not None else pack_micro_batch(input_ids, attention_mask, prompt_width)
            self.last_padding_share = packed.padding_share
            return self.packed(model, packed, temperature, with_entropy, entropy_grad, truncation, capture)
        return self.padded(
            model, input_ids, attention_mask, prompt_width, temperature, with_entropy, entropy_grad, truncation, capture
        )

    def _chunk_rows(self, vocab_size: int, device: torch.device, head: nn.Linear | None = None) -> int:
        """Token positions per chunk so that their float32 logits fit ``chunk_mb`` (auto: by ``device``,
        and smaller through a frozen ``head``: LoRA's, a reference model's)."""
        frozen = head is not None and not head.weight.requires_grad
        return max(1, int(logprob_chunk_mb(self.chunk_mb, device.type, frozen) * 2**20) // (4 * vocab_size))

    def padded(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_width: int,
        temperature: float,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        truncation: Truncation | None = None,
        capture: list[CapturedRows] | None = None,
    ) -> TokenLogProbs:
        """The rows as they are (left-padded prompts, right-padded completions).

        Models with a plain linear output head go through the decoder and then the head a
        chunk of rows at a time (:func:`lm_head_log_probs`: no [B, T, V] logits tensor);
        others through their full logits, upcast a chunk at a time.
        """
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        targets = input_ids[:, prompt_width:]
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        head = plain_output_head(model)
        if head is not None:
            hidden = model.get_decoder()(**inputs).last_hidden_state[:, prompt_width - 1 : -1]
            if capture is not None:
                valid = attention_mask[:, prompt_width:].bool()
                capture.append(CapturedRows(hidden[valid], valid, head))
            rows = self._chunk_rows(head.out_features, hidden.device, head)
            return lm_head_log_probs(
                hidden, head, targets, temperature, rows, with_entropy, entropy_grad, truncation, self.kernels
            )
        logits = model(**inputs, logits_to_keep=targets.shape[1] + 1).logits[:, :-1]
        rows = self._chunk_rows(logits.shape[-1], logits.device)
        return selective_log_probs(logits, targets, temperature, rows, with_entropy, entropy_grad, truncation)

    def packed(
        self,
        model: nn.Module,
        packed: PackedMicroBatch,
        temperature: float,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        truncation: Truncation | None = None,
        capture: list[CapturedRows] | None = None,
    ) -> TokenLogProbs:
        """The packed rows; the output head sees only the positions that predict a completion token."""
        inputs = dict(
            input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False
        )
        targets = packed.targets[None]
        head = plain_output_head(model)
        if head is not None:
            hidden = model.get_decoder()(**inputs).last_hidden_state
            chosen = hidden.reshape(-1, hidden.shape[-1])[packed.source][None]
            if capture is not None:
                capture.append(CapturedRows(chosen[0], packed.completion_valid, head))
            out = lm_head_log_probs(
                chosen,
                head,
                targets,
                temperature,
                self._chunk_rows(head.out_features, chosen.device, head),
                with_entropy,
                entropy_grad,
                truncation,
                self.kernels,
            )
        else:
            logits = model(**inputs).logits
            chosen = logits.reshape(-1, logits.shape[-1])[packed.source][None]
            out = selective_log_probs(
                chosen,
                targets,
                temperature,
                self._chunk_rows(logits.shape[-1], chosen.device),
                with_entropy,
                entropy_grad,
                truncation,
            )
        valid = packed.completion_valid
        return TokenLogProbs(
            logp=scatter_completion(out.logp[0], valid, 0.0),
            entropy=scatter_completion(out.entropy[0], valid, 0.0) if out.entropy is not None else None,
            finite=scatter_completion(out.finite[0], valid, True),
        )

    @torch.no_grad()
    def _probe(self, model: nn.Module) -> bool:
        """Packed and padded log-probs of three random sequences agree (two of them share a packed row)."""
        embeddings = model.get_input_embeddings()
        device = embeddings.weight.device
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, embeddings.num_embeddings, (3, 12), generator=generator).to(device)
        mask = torch.ones(3, 12, dtype=torch.long, device=device)
        mask[1, :3], mask[1, 8:] = 0, 0  # 5 tokens: prompt 3 + completion 2
        mask[2, :4], mask[2, 10:] = 0, 0  # 6 tokens: prompt 2 + completion 4; with row 1 in one packed row
        was_training = model.training
        model.eval()  # dropout would make the two computations differ
        try:
            packed = pack_micro_batch(ids, mask, 6)
            got = self.packed(model, packed, 1.0).logp
            want = self.padded(model, ids, mask, 6, 1.0).logp
        finally:
            model.train(was_training)
        valid = packed.completion_valid
        diff = float((got - want)[valid].abs().mean())
        dtype = embeddings.weight.dtype
        tolerance = PROBE_TOLERANCE.get(dtype, PROBE_TOLERANCE_16BIT)
        if not diff <= tolerance:
            warnings.warn(
                f"algorithm.pack_sequences: packed and padded log-probs of {type(model).__name__} differ by "
                f"{diff:.3g} nats on average (tolerance {tolerance:g}): its attention does not restart at "
                "packed position ids, so tokens would see other sequences. Training runs padded; set "
                "algorithm.pack_sequences=false to silence this.",
                stacklevel=2,
            )
            return False
        return True
