"""Rollouts with the policy's own Hugging Face model, each sample from its own seeded stream.

Four decoders draw the same tokens from the same streams: ``loop`` is a bare KV-cache loop
(prefill, then one forward per token, stopping when every sample has ended); ``fused`` (the
default) is that loop with the model's forward replaced by a fused prefill and one-token step
over the model's own weights for Llama-family models (:mod:`grpo_lightning.rollout.fused_decode`;
other models keep the forward); ``graph`` is the fused loop with a fixed-shape step, replayed
as one CUDA graph per token on a GPU, in any dtype (:mod:`grpo_lightning.rollout.graph_decode`);
``generate`` goes through ``model.generate`` with the draw made in a logits processor. On small models ``generate``'s per-token bookkeeping costs as much
as the model itself: on the tiny policy the loop takes about half of ``generate``'s time per
rollout, and the fused decoder under half of the loop's. A sharded policy (FSDP) always uses
``generate``, whose ``synced_gpus`` keeps ranks stepping together.
"""

from __future__ import annotations

import inspect
import warnings

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel

from grpo_lightning.config import HF_DECODERS, TrainConfig
from grpo_lightning.models.compile import eager_generation
from grpo_lightning.models.sharding import is_sharded
from grpo_lightning.models.vision.families import is_vision_config
from grpo_lightning.models.vision.features import FeatureCache
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import ENGINES, Completion, EngineBase, GenerationRequest, Sampling
from grpo_lightning.rollout.fused_decode import FusedDecoder, FusedWeights, fused_decode_support
from grpo_lightning.rollout.graph_decode import (
    GraphDecoder,
    SampledGraphLoop,
    check_tolerance,
    graph_decode_support,
)
from grpo_lightning.rollout.pipeline.hf_engine import HFPipelineEngine
from grpo_lightning.rollout.sampler import SeededSampler
from grpo_lightning.rollout.vision_decode import VisionDecoder, fused_text_decoder


class _SampleInProcessor(LogitsProcessor):
    """Samples inside the logits processor and leaves only the drawn token finite.

    ``generate`` then runs greedily, so the token it picks is the one our per-sample stream
    drew: HF's global-RNG sampling (one stream for the whole batch) never runs.
    """

    def __init__(self, sampler: SeededSampler):
        self.sampler = sampler
        self.step_logprobs: list[torch.Tensor] = []
        self.progress = None  # a tqdm bar, one tick per generated token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens, logprobs = self.sampler.draw(scores)
        self.step_logprobs.append(logprobs.cpu())
        if self.progress is not None:
            self.progress.update()
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter(-1, tokens[:, None], 0.0)


# ``LogitsProcessorList`` reads each processor's signature on every token (``inspect.signature``,
# slower than the small model's sampling itself); a ``__signature__`` answers it at once.
_SampleInProcessor.__call__.__signature__ = inspect.signature(_SampleInProcessor.__call__)


class _ForwardDecoder:
    """Prefill and one-token steps through the model's own forward over a ``DynamicCache``."""

    def __init__(self, model: PreTrainedModel, mask: torch.Tensor):
        self.model, self.mask, self.cache = model, mask, DynamicCache()
        self.position = (mask.cumsum(dim=1) - 1).clamp(min=0)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(
            input_ids=prompt_ids,
            attention_mask=self.mask,
            position_ids=self.position,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        self.position = self.position[:, -1:]
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        self.position = self.position + 1
        return self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.position,
            past_key_values=self.cache,
            use_cache=True,
        ).logits[:, -1]


class _CheckedDecoder:
    """The fused decoder beside the forward for the prefill and the first step of an engine's first
    rollout: if their logits agree, the engine keeps the fused decoder; if not, it warns and
    decodes with the forward from then on (this rollout included)."""

    def __init__(self, engine: HFEngine, fused: FusedDecoder, forward: _ForwardDecoder):
        self.engine, self.fused, self.forward = engine, fused, forward
        self.active = None  # the decoder that goes on, once the first step was compared

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        got, want = self.fused.prefill(prompt_ids), self.forward.prefill(prompt_ids)
        return got if self._agree(got, want, "prefill") else want

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.active is not None:
            return self.active.step(tokens)
        got, want = self.fused.step(tokens), self.forward.step(tokens)
        agree = self._agree(got, want, "first step")
        self.engine.fused_checked = agree
        self.active = self.fused if agree else self.forward
        return got if agree else want

    def _agree(self, got: torch.Tensor, want: torch.Tensor, where: str) -> bool:
        difference, tolerance = float((got.float() - want.float()).abs().max()), check_tolerance(want)
        if difference <= tolerance:
            return True
        self.engine.fused_checked, self.active = False, self.forward
        warnings.warn(
            f"rollout.hf_decoder={self.engine.decoder}: the fused decoder's {where} logits of "
            f"{type(self.engine.model).__name__} differ from its forward's by {difference:.2e} (more than "
            f"{tolerance:.2g}); decoding with the "
            "model's forward from now on (rollout.hf_decoder=loop skips this check)",
            stacklevel=3,
        )
        return False


class HFEngine(EngineBase):
    """Generates with the policy itself (colocated: no weight sync is ever needed, so
    ``owns_weights`` is False and every completion's weight version is None: the live policy)."""

    # On a GPU the decode loop asks whether every row has ended only every this many tokens:
    # each question waits for the GPU, which then idles while the host launches the next token's
    # work. Rows that ended decode padding meanwhile; the completions are the same.
    cuda_check_every = 16

    def __init__(
        self,
        model: PreTrainedModel,
        pad_token_id: int,
        eos_token_id: int,
        batch_size: int = 64,
        progress_min_tokens: int = 0,
        decoder: str = "fused",
        compile_decode: bool = False,
    ):
        if decoder not in HF_DECODERS:
            raise ValueError(f"rollout.hf_decoder={decoder!r} is not allowed; choose one of {list(HF_DECODERS)}")
        self.decoder = decoder
        self.compile_decode = compile_decode  # decoder=graph on CUDA: torch.compile the step too
        # decoder=fused: None until the fused decoder's first prefill and step were compared with
        # the model's forward (or the model found unsupported), then whether it is used.
        self.fused_checked: bool | None = None
        self._fused_weights: FusedWeights | None = None  # the policy's, during one generate call
        self.model = model
        # A vision-language policy decodes with VisionDecoder (models/vision/: images, 3-D positions).
        self.vision = is_vision_config(getattr(model, "config", None))
        self._features: FeatureCache | None = None  # image features of one generate call's prompts
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.batch_size = batch_size
        # Long rollouts (max_new_tokens >= this) show a per-token progress bar; 0: never.
        self.progress_min_tokens = progress_min_tokens

    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        was_training = self.model.training
        self.model.eval()
        try:
            completions: list[Completion] = []
            with eager_generation(self.model):  # model.compile compiles the training passes only
                for start in range(0, len(requests), self.batch_size):
                    completions.extend(self._generate_chunk(requests[start : start + self.batch_size], sampling))
            return completions
        finally:
            self._fused_weights = None  # copies of weights that change with the next optimizer step
            self._features = None  # made by weights that change with the next optimizer step
            self.model.train(was_training)

    def _progress(self, requests: list[GenerationRequest], sampling: Sampling):
        show = 0 < self.progress_min_tokens <= sampling.max_new_tokens
        return tqdm(
            total=sampling.max_new_tokens,
            desc=f"rollout: {len(requests)} sequences",
            unit="tok",
            leave=False,
            disable=not show,
        )

    def _generate_chunk(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        if self.vision or (self.decoder in ("loop", "fused", "graph") and not is_sharded(self.model)):
            return self._decode_chunk(requests, sampling)
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = RolloutBatch.pad_prompts([r.prompt_ids for r in requests], self.pad_token_id)
        processor = _SampleInProcessor(SeededSampler([r.seed for r in requests], sampling))
        processor.progress = self._progress(requests, sampling)
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
        )
        output = self.model.generate(
            input_ids=prompt_ids.to(device),
            attention_mask=prompt_mask.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([processor]),
            # Sharded (trainer.strategy=fsdp): every forward all-gathers weights on all ranks, so
            # a rank whose samples all ended keeps stepping until every rank's have.
            synced_gpus=is_sharded(self.model),
        )
        processor.progress.close()
        return self._completions(output[:, prompt_ids.shape[1] :].cpu(), torch.stack(processor.step_logprobs, dim=1))

    def _decode_chunk(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        """The bare KV-cache loop: the same streams, tokens and log-probs as ``generate``."""
        device = next(self.model.parameters()).device
        prompt_ids, mask = RolloutBatch.pad_prompts([r.prompt_ids for r in requests], self.pad_token_id)
        prompt_ids, mask = prompt_ids.to(device), mask.to(device)
        sampler = SeededSampler([r.seed for r in requests], sampling)
        progress = self._progress(requests, sampling)
        if self.vision:
            self._features = self._features or FeatureCache()  # a prompt's features once per generate call
            fused = (
                fused_text_decoder(self.model, mask, sampling.max_new_tokens - 1) if self.decoder == "fused" else None
            )
            decoder = VisionDecoder(self.model, mask, [r.vision for r in requests], self._features, fused)
        else:
            decoder = self._decoder(mask, sampling.max_new_tokens - 1)
        logits = decoder.prefill(prompt_ids)
        if isinstance(decoder, GraphDecoder):  # checked already: the draw joins the recorded step
            loop = SampledGraphLoop(decoder, sampler, logits, self.pad_token_id, self.eos_token_id)
            return self._sampled_graph_chunk(loop, progress)
        ended = torch.zeros(len(requests), dtype=torch.bool, device=device)
        tokens, logprobs = [], []
        check_every = self.check_every(device)
        if is_sharded(self.model):  # every rank steps as often as the others (each forward is collectives)
            check_every = sampling.max_new_tokens + 1
        for step in range(sampling.max_new_tokens):
            token, logp = sampler.draw(logits)
            token = torch.where(ended, self.pad_token_id, token)  # as generate pads ended rows
            tokens.append(token)
            logprobs.append(logp)
            ended |= token == self.eos_token_id
            progress.update()
            if step == sampling.max_new_tokens - 1 or ((step + 1) % check_every == 0 and bool(ended.all())):
                break
            logits = decoder.step(token)
        progress.close()
        return self._completions(torch.stack(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1).cpu())

    def _sampled_graph_chunk(self, loop: SampledGraphLoop, progress) -> list[Completion]:
        """:meth:`_decode_chunk`'s loop with the draw inside the graph decoder's recorded step."""
        max_new_tokens = loop.tokens.shape[1]
        check_every = self.check_every(loop.logits.device)
        drawn = 0
        while drawn < max_new_tokens:
            if drawn == max_new_tokens - 1:
                loop.draw()  # the last token needs no step after it
            else:
                loop.draw_and_step()
            drawn += 1
            progress.update()
            if drawn % check_every == 0 and bool(loop.ended.all()):
                break
        progress.close()
        return self._completions(loop.tokens[:, :drawn].cpu(), loop.logprobs[:, :drawn].cpu())

    def check_every(self, device: torch.device) -> int:
        """Tokens between the loop's checks for ended rows on ``device`` (1 on a CPU: no idle GPU)."""
        return self.cuda_check_every if device.type == "cuda" else 1

    def _decoder(self, mask: torch.Tensor, max_steps: int):
        """The loop's decoder for left-padded prompts ``mask`` and up to ``max_steps`` steps after the
        prefill: the model's forward, or (``decoder=fused``, where :func:`fused_decode_support`
        allows it) the fused decoder, checked against the forward on its first rollout."""
        if self.decoder not in ("fused", "graph") or self.fused_checked is False:
            return _ForwardDecoder(self.model, mask)
        support = graph_decode_support if self.decoder == "graph" else fused_decode_support
        unsupported = support(self.model, mask.shape[1] + max_steps)
        if unsupported is not None:
            from lightning.pytorch.utilities import rank_zero_info  # noqa: PLC0415  (lightning: vLLM workers import rollout/)

            rank_zero_info(
                f"rollout.hf_decoder={self.decoder}: decoding with the model's forward instead: {unsupported}"
            )
            self.fused_checked = False
            return _ForwardDecoder(self.model, mask)
        if self._fused_weights is None:  # once per generate call: every chunk decodes with the same weights
            self._fused_weights = FusedWeights(self.model)
        if self.decoder == "graph":
            fused = GraphDecoder(self.model, mask, max_steps, self._fused_weights, compiled=self.compile_decode)
        else:
            fused = FusedDecoder(self.model, mask, max_steps, self._fused_weights)
        return fused if self.fused_checked else _CheckedDecoder(self, fused, _ForwardDecoder(self.model, mask))

    def _completions(self, new_tokens: torch.Tensor, step_logprobs: torch.Tensor) -> list[Completion]:
        """Each row's tokens up to and including its EOS, with the log-probs they were drawn with."""
        completions = []
        for tokens, logprobs in zip(new_tokens.tolist(), step_logprobs.tolist(), strict=True):
            finished = self.eos_token_id in tokens
            length = tokens.index(self.eos_token_id) + 1 if finished else len(tokens)
            completions.append(Completion(token_ids=tokens[:length], finished=finished, logprobs=logprobs[:length]))
        return completions


@ENGINES.register("hf")
def hf_engine(policy, tokenizer, cfg: TrainConfig) -> HFEngine:
    """The policy samples its own completions (``rollout.hf_decoder``, ``generation_batch_size``;
    ``model.compile`` also compiles the ``graph`` decoder's step); ``rollout.mode=pipeline``: its streaming
    engine over a generation copy of the weights (:mod:`grpo_lightning.rollout.pipeline.hf_engine`)."""
    r = cfg.rollout
    if r.mode == "pipeline":
        return HFPipelineEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, r.generation_batch_size)
    return HFEngine(
        policy,
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        r.generation_batch_size,
        progress_min_tokens=r.progress_min_tokens,
        decoder=r.hf_decoder,
        compile_decode=cfg.model.compile,
    )
