"""Rollouts with the policy's own Hugging Face model, each sample from its own seeded stream.

Two decoders draw the same tokens from the same streams: ``loop`` (the default) is a bare
KV-cache loop (prefill, then one forward per token, stopping when every sample has ended);
``generate`` goes through ``model.generate`` with the draw made in a logits processor. On
small models ``generate``'s per-token bookkeeping costs as much as the model itself: on the
tiny policy the loop takes about half of ``generate``'s time per rollout. A sharded policy
(FSDP) always uses ``generate``, whose ``synced_gpus`` keeps ranks stepping together.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel

from grpo_lightning.config import HF_DECODERS
from grpo_lightning.models.compile import eager_generation
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.sharding import is_sharded
from grpo_lightning.rollout.engine import Completion, GenerationRequest, SamplingSettings
from grpo_lightning.rollout.sampler import SeededSampler


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


class HFEngine:
    """Generates with the policy itself (colocated: no weight sync is ever needed)."""

    def __init__(
        self, model: PreTrainedModel, pad_token_id: int, eos_token_id: int, batch_size: int = 64,
        progress_min_tokens: int = 0, decoder: str = "loop",
    ):
        if decoder not in HF_DECODERS:
            raise ValueError(f"rollout.hf_decoder={decoder!r} is not allowed; choose one of {list(HF_DECODERS)}")
        self.decoder = decoder
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.batch_size = batch_size
        # Long rollouts (max_new_tokens >= this) show a per-token progress bar; 0: never.
        self.progress_min_tokens = progress_min_tokens

    @torch.no_grad()
    def generate(
        self, requests: list[GenerationRequest], sampling: SamplingSettings
    ) -> list[Completion]:
        was_training = self.model.training
        self.model.eval()
        try:
            completions: list[Completion] = []
            with eager_generation(self.model):  # model.compile compiles the training passes only
                for start in range(0, len(requests), self.batch_size):
                    completions.extend(self._generate_chunk(requests[start : start + self.batch_size], sampling))
            return completions
        finally:
            self.model.train(was_training)

    def _progress(self, requests: list[GenerationRequest], sampling: SamplingSettings):
        show = 0 < self.progress_min_tokens <= sampling.max_new_tokens
        return tqdm(
            total=sampling.max_new_tokens, desc=f"rollout: {len(requests)} sequences", unit="tok",
            leave=False, disable=not show,
        )

    def _generate_chunk(
        self, requests: list[GenerationRequest], sampling: SamplingSettings
    ) -> list[Completion]:
        if self.decoder == "loop" and not is_sharded(self.model):
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

    def _decode_chunk(self, requests: list[GenerationRequest], sampling: SamplingSettings) -> list[Completion]:
        """The bare KV-cache loop: the same streams, tokens and log-probs as ``generate``."""
        device = next(self.model.parameters()).device
        prompt_ids, mask = RolloutBatch.pad_prompts([r.prompt_ids for r in requests], self.pad_token_id)
        prompt_ids, mask = prompt_ids.to(device), mask.to(device)
        sampler = SeededSampler([r.seed for r in requests], sampling)
        progress = self._progress(requests, sampling)
        cache = DynamicCache()
        position = (mask.cumsum(dim=1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=prompt_ids, attention_mask=mask, position_ids=position, past_key_values=cache,
            use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        position = position[:, -1:]
        ended = torch.zeros(len(requests), dtype=torch.bool, device=device)
        tokens, logprobs = [], []
        for step in range(sampling.max_new_tokens):
            token, logp = sampler.draw(logits)
            token = torch.where(ended, self.pad_token_id, token)  # as generate pads ended rows
            tokens.append(token)
            logprobs.append(logp.cpu())
            ended |= token == self.eos_token_id
            progress.update()
            if step == sampling.max_new_tokens - 1 or bool(ended.all()):
                break
            mask, position = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1), position + 1
            logits = self.model(
                input_ids=token[:, None], attention_mask=mask, position_ids=position, past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
        progress.close()
        return self._completions(torch.stack(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1))

    def _completions(self, new_tokens: torch.Tensor, step_logprobs: torch.Tensor) -> list[Completion]:
        """Each row's tokens up to and including its EOS, with the log-probs they were drawn with."""
        completions = []
        for row in range(new_tokens.shape[0]):
            tokens = new_tokens[row].tolist()
            finished = self.eos_token_id in tokens
            length = tokens.index(self.eos_token_id) + 1 if finished else len(tokens)
            completions.append(
                Completion(
                    token_ids=tokens[:length],
                    finished=finished,
                    logprobs=step_logprobs[row, :length].tolist(),
                )
            )
        return completions
