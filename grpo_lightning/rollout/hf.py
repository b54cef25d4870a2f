"""Rollouts with Hugging Face ``generate``, each sample from its own seeded stream."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel

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
        progress_min_tokens: int = 0,
    ):
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
            for start in range(0, len(requests), self.batch_size):
                completions.extend(self._generate_chunk(requests[start : start + self.batch_size], sampling))
            return completions
        finally:
            self.model.train(was_training)

    def _generate_chunk(
        self, requests: list[GenerationRequest], sampling: SamplingSettings
    ) -> list[Completion]:
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = RolloutBatch.pad_prompts([r.prompt_ids for r in requests], self.pad_token_id)
        processor = _SampleInProcessor(SeededSampler([r.seed for r in requests], sampling))
        show = 0 < self.progress_min_tokens <= sampling.max_new_tokens
        processor.progress = tqdm(
            total=sampling.max_new_tokens, desc=f"rollout: {len(requests)} sequences", unit="tok",
            leave=False, disable=not show,
        )
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
        new_tokens = output[:, prompt_ids.shape[1] :].cpu()
        step_logprobs = torch.stack(processor.step_logprobs, dim=1)  # [B, steps]
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
