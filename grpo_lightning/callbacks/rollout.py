"""``RolloutCallback``: turns a batch of prompt records into a scored ``RolloutBatch``.

Before each training step it tokenizes the prompts (once per distinct prompt), asks the
engine for ``num_generations`` completions per prompt, each with its own seed derived from
(run seed, rank, step, prompt, sample), scores them, and hands the batch to the module.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import lightning as L
import torch
from transformers import PreTrainedTokenizerBase

from grpo_lightning.data.lookahead import current_records
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import Completion, GenerationRequest, RolloutBatch, RolloutEngine, SamplingSettings
from grpo_lightning.rollout.seeding import group_seeds

EngineFactory = Callable[[L.LightningModule], RolloutEngine]


class RolloutCallback(L.Callback):
    def __init__(
        self,
        engine: RolloutEngine | EngineFactory,
        tokenizer: PreTrainedTokenizerBase,
        scorer: RewardScorer,
        num_generations: int,
        sampling: SamplingSettings,
        seed: int = 0,
        formatter: Callable[[str], list[int]] | None = None,
    ):
        if num_generations < 2:
            raise ValueError(f"num_generations={num_generations} must be >= 2 (GRPO compares within a group)")
        self._engine_or_factory = engine
        self.engine: RolloutEngine | None = None
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.num_generations = num_generations
        self.sampling = sampling
        self.seed = seed
        # Prompt text -> ids (chat template, system prompt): data.prompting.PromptFormatter.
        self.formatter = formatter
        self._prompt_ids: dict[str, list[int]] = {}
        self.last_rollout: RolloutBatch | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.engine is None:
            source = self._engine_or_factory
            self.engine = source if isinstance(source, RolloutEngine) else source(pl_module)

    def tokenize_prompt(self, prompt: str) -> list[int]:
        """Token ids of a prompt, cached: the same prompt is tokenized once per run."""
        if prompt not in self._prompt_ids:
            if self.formatter is not None:
                self._prompt_ids[prompt] = list(self.formatter(prompt))
            else:
                self._prompt_ids[prompt] = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return self._prompt_ids[prompt]

    def make_rollout(self, records: list[dict], step: int, rank: int) -> RolloutBatch:
        """Generate and score G completions for each record; the unit tests call this directly."""
        start = time.perf_counter()
        requests = self.build_requests(records, step, rank)
        completions = self.engine.generate(requests, self.sampling)
        return self.assemble(records, requests, completions, step, time.perf_counter() - start)

    def build_requests(self, records: list[dict], step: int, rank: int) -> list[GenerationRequest]:
        """G requests per record, prompt-major, each with the seed of (run, rank, step, prompt, sample)."""
        seeds = group_seeds(self.seed, rank, step, len(records), self.num_generations)
        expanded = [record for record in records for _ in range(self.num_generations)]
        return [
            GenerationRequest(self.tokenize_prompt(record["prompt"]), seed)
            for record, seed in zip(expanded, seeds)
        ]

    def assemble(
        self, records: list[dict], requests: list[GenerationRequest], completions: list[Completion],
        step: int, generation_seconds: float,
    ) -> RolloutBatch:
        """Pad, decode and score the completions of ``requests`` into the batch of ``step``."""
        start = time.perf_counter()
        expanded = [record for record in records for _ in range(self.num_generations)]
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = RolloutBatch.pad_prompts([r.prompt_ids for r in requests], pad)
        completion_ids, completion_mask, finished, logprobs = RolloutBatch.pad_completions(completions, pad)
        texts = self.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
        prompts = [record["prompt"] for record in expanded]
        fields = {key: [record.get(key) for record in expanded] for key in records[0] if key != "prompt"}
        rewards, components = self.scorer(prompts, texts, fields)
        num_tokens = int(completion_mask.sum())
        self.timing = {
            "rollout/seconds": generation_seconds,
            "rollout/tokens_per_s": num_tokens / max(generation_seconds, 1e-9),
            "rollout/reward_seconds": time.perf_counter() - start,
        }
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            rewards=rewards,
            group_size=self.num_generations,
            max_new_tokens=self.sampling.max_new_tokens,
            temperature=self.sampling.temperature,
            step=step,
            reward_components=components,
            finished=finished,
            engine_logprobs=logprobs,
            prompts=prompts,
            completions=texts,
        )

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        # The count of generation batches, not global_step: a skipped optimizer step must not
        # repeat the previous step's seeds. Lightning restores it on resume.
        step = trainer.fit_loop.total_batch_idx
        rollout = self.make_rollout(current_records(batch), step=step, rank=trainer.global_rank)
        self.last_rollout = rollout
        pl_module.receive_rollout(rollout)
        pl_module.log_dict(self.timing, on_step=True, on_epoch=False, batch_size=rollout.num_sequences)
