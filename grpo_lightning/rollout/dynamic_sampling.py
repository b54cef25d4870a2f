"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2): keep only groups
whose rewards differ, and generate more prompts until the batch holds ``prompts_per_step`` of
them.

A tied group (:func:`grpo_lightning.algorithm.tied_groups`: every reward the same) has zero
advantage and no gradient; it only dilutes the batch. Round 0 generates the loader's prompts;
each further round draws ``prompts_per_step`` more prompts from the training records and
generates them, until enough informative groups are collected or ``max_rounds`` rounds ran.
The first ``prompts_per_step`` informative groups, in generation order, form the batch; if
the cap is reached first the batch is topped up with the earliest tied groups (zero
advantage, they add nothing but keep the batch shape), and the shortfall is logged.

**Reproducibility.** Extra prompts are a seeded draw from the training records, not the
loader's next batches (which belong to the next steps: taking them would shift every later
step's prompts). Round ``k`` of step ``s`` on rank ``r`` permutes the records with the seed
``sample_seed(run seed, r, s, -k, -1)`` and takes the first prompts not yet used in this
step. Its samples get the seeds of (run seed, rank, step, prompt index, sample) with prompt
indices continuing after the previous rounds' (round k's prompt i is ``k x P + i``), so every
completion of a step, in every round, has its own stream, and a repeated or resumed run
(the step is restored) draws the same prompts and the same completions.

Logged per step (in ``RolloutBatch.timing``, so under ``rollout/``): ``sampling_rounds``,
``prompts_generated``, ``informative_groups`` (before topping up) and
``informative_frac_first_round``. Each kept group is scored twice (once to decide, once in
the final batch), so reward functions should be deterministic.
"""

from __future__ import annotations

import json
import time
from typing import Protocol

import torch

from grpo_lightning.algorithm import tied_groups
from grpo_lightning.data.images import image_refs, ref_key
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import Completion, GenerationRequest, RolloutEngine, Sampling
from grpo_lightning.rollout.seeding import sample_seed


class Generates(Protocol):
    """What dynamic sampling needs of the rollout generator (which owns a ``DynamicSampling``):
    declared here so neither module imports the other."""

    num_generations: int
    seed: int
    engine: RolloutEngine
    sampling: Sampling

    def build_requests(
        self, records: list[dict], step: int, rank: int, first_prompt: int = 0
    ) -> list[GenerationRequest]: ...

    def assemble(
        self,
        records: list[dict],
        requests: list[GenerationRequest],
        completions: list[Completion],
        step: int,
        generation_seconds: float,
    ) -> RolloutBatch: ...


def prompt_key(prompt: str | list[dict]) -> str:
    """A prompt as a set member: chat messages (TRL's conversational format) are lists, so as JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def record_key(record: dict) -> str | tuple:
    """A row's prompt as a set member (:func:`prompt_key`), with its images where it has some: one question
    over two pictures is two prompts."""
    images = image_refs(record)
    key = prompt_key(record["prompt"])
    return (key, *(ref_key(r) for r in images)) if images else key


class DynamicSampling:
    """Fills a generation batch with informative groups; see the module docstring."""

    def __init__(self, pool: list[dict], max_rounds: int):
        if max_rounds < 1:
            raise ValueError(f"rollout.max_sampling_rounds={max_rounds} must be >= 1")
        if not pool:
            raise ValueError("dynamic sampling needs the training records to draw extra prompts from")
        self.pool = pool
        self.max_rounds = max_rounds

    def extra_prompts(self, run_seed: int, rank: int, step: int, round_index: int, count: int, used: set) -> list[dict]:
        """Round ``round_index``'s prompts: a seeded permutation of the pool, minus prompts used this step."""
        generator = torch.Generator().manual_seed(sample_seed(run_seed, rank, step, -round_index, -1))
        order = torch.randperm(len(self.pool), generator=generator).tolist()
        fresh = [self.pool[i] for i in order if record_key(self.pool[i]) not in used]
        if len(fresh) < count:  # a small pool: allow repeats rather than stop
            fresh += [self.pool[i] for i in order][: count - len(fresh)]
        return fresh[:count]

    def rollout(self, generator: Generates, records: list[dict], step: int, rank: int) -> RolloutBatch:
        start = time.perf_counter()
        size, wanted = generator.num_generations, len(records)
        informative: list[tuple[dict, list, list]] = []  # (record, requests, completions) per group
        tied: list[tuple[dict, list, list]] = []
        used = {record_key(r) for r in records}
        batch_records, rounds, generated, first_frac = records, 0, 0, 0.0
        while True:
            requests = generator.build_requests(batch_records, step, rank, first_prompt=generated)
            completions = generator.engine.generate(requests, generator.sampling)
            scored = generator.assemble(batch_records, requests, completions, step, 0.0)
            flat = tied_groups(scored.rewards, size).tolist()
            if rounds == 0:
                first_frac = 1.0 - sum(flat) / len(flat)
            for g, (record, is_tied) in enumerate(zip(batch_records, flat, strict=True)):
                group = (record, requests[g * size : (g + 1) * size], completions[g * size : (g + 1) * size])
                (tied if is_tied else informative).append(group)
            rounds += 1
            generated += len(batch_records)
            if len(informative) >= wanted or rounds >= self.max_rounds:
                break
            batch_records = self.extra_prompts(generator.seed, rank, step, rounds, wanted, used)
            used.update(record_key(r) for r in batch_records)
        found = min(len(informative), wanted)
        chosen = informative[:wanted] + tied[: wanted - found]
        batch = generator.assemble(
            [g[0] for g in chosen],
            [q for g in chosen for q in g[1]],
            [c for g in chosen for c in g[2]],
            step,
            time.perf_counter() - start,
        )
        batch.timing.update(
            {
                "rollout/sampling_rounds": float(rounds),
                "rollout/prompts_generated": float(generated),
                "rollout/informative_groups": float(found),
                "rollout/informative_frac_first_round": first_frac,
            }
        )
        return batch
