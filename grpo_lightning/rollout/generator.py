"""``RolloutGenerator``: prompt records in, a scored ``RolloutBatch`` out.

The module owns one and calls it at the top of ``training_step`` (see ``GRPOModule``): it
tokenizes the prompts (once per distinct prompt), asks the engine for ``num_generations``
completions per prompt, each with its own seed derived from (run seed, rank, step, prompt,
sample), and scores them. An engine that keeps its own copy of the weights (vLLM) gets the
policy's weights pushed by the generator's :class:`WeightSync` after each optimizer step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch.distributed as dist
from torch import nn
from transformers import PreTrainedTokenizerBase

from grpo_lightning.data.lookahead import current_records
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.data.vision_prompting import VisionPrompts, display_text
from grpo_lightning.records import PolicyWeights, VisionInputs
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rewards.columns import repeat_columns
from grpo_lightning.rewards.scorer import RewardState, as_reward_completions
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.dynamic_sampling import DynamicSampling
from grpo_lightning.rollout.engine import Completion, EngineError, GenerationRequest, RolloutEngine, Sampling
from grpo_lightning.rollout.seeding import group_seeds
from grpo_lightning.rollout.weight_sync import ProbeScores, WeightSync

EngineFactory = Callable[[nn.Module], RolloutEngine]


@contextmanager
def engine_context(step: int, rank: int, what: str = "generation"):
    """Engine failures name the step and rank they happened at."""
    try:
        yield
    except EngineError as err:
        raise type(err)(f"{what} at rollout step {step} on rank {rank}: {err}") from err


def once_per_prompt(requests: list[GenerationRequest], text: Callable[[GenerationRequest], str]) -> list[str]:
    """``text`` of each request, computed once per prompt: a group's G requests share their prompt's ids
    and images (the same objects, :meth:`RolloutGenerator.build_requests`)."""
    done: dict[tuple[int, int], str] = {}
    out = []
    for r in requests:
        key = (id(r.prompt_ids), id(r.vision))
        if key not in done:
            done[key] = text(r)
        out.append(done[key])
    return out


class RolloutGenerator:
    """Generates and scores the completions of each training step (synchronously).

    ``engine`` is an engine, or a factory ``policy -> engine`` called once by :meth:`setup`
    (the module's ``setup``), so an engine can be built around the policy the module trains.
    ``weight_sync`` keeps an engine with weights of its own (``owns_weights``) equal
    to the policy; such an engine gets a default :class:`WeightSync` if none is given, so it
    can never sample from stale weights by omission.
    """

    def __init__(
        self,
        engine: RolloutEngine | EngineFactory,
        tokenizer: PreTrainedTokenizerBase,
        scorer: RewardScorer,
        num_generations: int,
        sampling: Sampling,
        seed: int = 0,
        formatter: Callable[[str], list[int]] | None = None,
        weight_sync: WeightSync | None = None,
    ):
        if num_generations < 2:
            raise ValueError(f"num_generations={num_generations} must be >= 2 (GRPO compares within a group)")
        self._engine_or_factory = engine
        self.engine: RolloutEngine | None = engine if isinstance(engine, RolloutEngine) else None
        if self.engine is None and not callable(engine):
            raise TypeError(
                f"{type(engine).__name__} is neither a RolloutEngine (declare every method of the protocol, "
                f"e.g. by subclassing grpo_lightning.rollout.EngineBase) nor a factory policy -> engine"
            )
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.num_generations = num_generations
        self.sampling = sampling
        self.seed = seed
        # Prompt text -> ids (chat template, system prompt): data.prompting.PromptFormatter.
        self.formatter = formatter
        self._prompt_ids: dict[str, list[int]] = {}
        self._weight_sync = weight_sync
        # DAPO's dynamic sampling (rollout.dynamic_sampling): set by build_run; None generates the loader's prompts only.
        self.dynamic: DynamicSampling | None = None
        # Multi-turn episodes (grpo_lightning.environments.rollout.EpisodeRollout), set by build_run when the
        # task names an environment: a step's batch is then played in environments instead.
        self.episodes = None
        self._owns_engine = False  # built from the factory: this generator shuts it down
        # What trainer_state tells reward functions: the run's max_steps and the training prompts
        # (for the epoch), set by build_run; 0 where unknown.
        self.max_steps = 0
        self.num_train_prompts = 0
        # A vision-language policy's prompts (rows with images), set by build_run: ids and images per prompt.
        self.vision: VisionPrompts | None = None

    # ----------------------------------------------------------------------- set-up
    def setup(self, policy: nn.Module) -> None:
        """Build the engine from its factory (once)."""
        if self.engine is None:
            self.engine = self._engine_or_factory(policy)
            self._owns_engine = True

    @property
    def weight_sync(self) -> WeightSync | None:
        """The sync of an engine with its own weights; None for engines that use the policy itself."""
        if self.engine is None or not self.engine.owns_weights:
            return None
        if self._weight_sync is None:
            self._weight_sync = WeightSync()
        return self._weight_sync

    # ----------------------------------------------------------------------- generation
    def tokenize_prompt(self, prompt: str | list[dict]) -> list[int]:
        """Token ids of a prompt (text, or chat messages), cached: the same prompt is tokenized once per run."""
        key = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
        if key not in self._prompt_ids:
            if self.formatter is not None:
                self._prompt_ids[key] = list(self.formatter(prompt))
            elif isinstance(prompt, str):
                self._prompt_ids[key] = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
            else:
                self._prompt_ids[key] = PromptFormatter(self.tokenizer)(prompt)
        return self._prompt_ids[key]

    def rollout_for_step(self, batch, step: int, rank: int) -> RolloutBatch:
        """The scored generation batch of training step ``step`` from the loader's ``batch``."""
        if self.dynamic is not None:
            return self.dynamic.rollout(self, current_records(batch), step, rank)
        return self.generate(current_records(batch), step, rank)

    def generate(self, records: list[dict], step: int, rank: int) -> RolloutBatch:
        """Generate and score G completions for each record."""
        if self.engine is None:
            raise RuntimeError("RolloutGenerator has no engine yet: call setup(policy) (GRPOModule.setup does)")
        if self.episodes is not None:
            with engine_context(step, rank):
                return self.episodes.rollout(self, records, step, rank)
        start = time.perf_counter()
        requests = self.build_requests(records, step, rank)
        with engine_context(step, rank):
            completions = self.engine.generate(requests, self.sampling)
        return self.assemble(records, requests, completions, step, time.perf_counter() - start)

    def build_requests(
        self, records: list[dict], step: int, rank: int, first_prompt: int = 0
    ) -> list[GenerationRequest]:
        """G requests per record, prompt-major, each with the seed of (run, rank, step, prompt, sample);
        the records' prompt indices start at ``first_prompt`` (extra rounds of dynamic sampling)."""
        # Prompt indices first_prompt.. : the tail of the seeds of first_prompt + len(records) prompts.
        seeds = group_seeds(self.seed, rank, step, first_prompt + len(records), self.num_generations)
        seeds = seeds[first_prompt * self.num_generations :]
        if self.vision is not None:  # once per prompt, shared by its G requests; new prompts in one processor call
            prompts = self.vision.many(records)
        else:
            prompts = [self.prompt_inputs(record) for record in records]
        expanded = [prompt for prompt in prompts for _ in range(self.num_generations)]
        return [GenerationRequest(ids, seed, vision) for (ids, vision), seed in zip(expanded, seeds, strict=True)]

    def prompt_inputs(self, record: dict) -> tuple[list[int], VisionInputs | None]:
        """A record's prompt ids, and its images for a vision-language policy (None for text)."""
        if self.vision is not None:
            return self.vision(record)
        return self.tokenize_prompt(record["prompt"]), None

    def assemble(
        self,
        records: list[dict],
        requests: list[GenerationRequest],
        completions: list[Completion],
        step: int,
        generation_seconds: float,
    ) -> RolloutBatch:
        """Pad, decode and score the completions of ``requests`` into the batch of ``step``."""
        start = time.perf_counter()
        expanded = [record for record in records for _ in range(self.num_generations)]
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = RolloutBatch.pad_prompts([r.prompt_ids for r in requests], pad)
        completion_ids, completion_mask, finished, logprobs = RolloutBatch.pad_completions(completions, pad)
        texts = self.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
        prompts = [record["prompt"] for record in expanded]
        fields = repeat_columns(records, self.num_generations)
        fields["max_new_tokens"] = [self.sampling.max_new_tokens] * len(completions)  # the budget (overlong_penalty)
        rewards, components = self.scorer(
            prompts,
            as_reward_completions(prompts, texts),
            fields,
            completion_ids=[list(c.token_ids) for c in completions],
            trainer_state=self.reward_state(step, len(records)),
        )
        if self.vision is not None:  # images shown (and identified) by their hashes in the prompt's text
            token = self.vision.image_token_id
            prompts = once_per_prompt(requests, lambda r: display_text(self.tokenizer, r.prompt_ids, r.vision, token))
        elif prompts and not isinstance(prompts[0], str):  # chat messages: the batch keeps their text
            prompts = once_per_prompt(requests, lambda r: self.tokenizer.decode(r.prompt_ids))
        num_tokens = int(completion_mask.sum())
        versions = [c.weight_version for c in completions if c.weight_version is not None]
        timing = {
            "rollout/seconds": generation_seconds,
            "rollout/tokens_per_s": num_tokens / max(generation_seconds, 1e-9),
            "rollout/reward_seconds": time.perf_counter() - start,
        }
        return RolloutBatch(
            reward_metrics=self.scorer.last_logs.metrics,
            reward_extra=self.scorer.last_logs.extra,
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
            sources=[str(s) for s in fields["data_source"]] if "data_source" in fields else [],
            timing=timing,
            weight_version=min(versions) if versions else None,
            vision=[r.vision for r in requests] if self.vision is not None else None,
            **RolloutBatch.pad_token_fields(completions),
        )

    def reward_state(self, step: int, prompts: int) -> RewardState:
        """TRL's trainer_state for the batch of ``step``: the step, the passes over the training prompts, max_steps."""
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        epoch = step * prompts * world / self.num_train_prompts if self.num_train_prompts else 0.0
        return RewardState(global_step=step, epoch=epoch, max_steps=self.max_steps)

    # ----------------------------------------------------------------------- weights
    def sync_weights(
        self, weights: PolicyWeights, expected: ProbeScores | None = None, rank: int = 0
    ) -> dict[str, float]:
        """Push ``weights`` into an engine that has its own (see :func:`grpo_lightning.step.weight_push.push_weights`,
        which decides when); returns the metrics to log."""
        with engine_context(weights.version, rank, "weight sync"):
            return self.weight_sync.sync(weights, self.engine, expected)

    def close(self) -> None:
        """End of training or an exception: nothing in flight in synchronous generation."""

    def shutdown(self) -> None:
        """Release an engine this generator built (a launched vLLM server stops); an engine
        handed in stays up. The CLI calls it when a run ends; an exception in fit calls it too."""
        self.close()
        if self._owns_engine and self.engine is not None:
            self.engine.close()
            self.engine, self._owns_engine = None, False
