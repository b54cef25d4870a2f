"""``PromptStream``: a rank's training prompts in data order, numbered, for the pipeline's producer.

The producer draws prompt after prompt in the order the sync loader would batch them (the data
module's seeded sampler for this rank), whatever order their groups finish in. Prompt number
``k`` (its *ordinal*) is the sync run's prompt ``k % P`` of step ``k // P`` (``P`` prompts per
step), and its samples get that prompt's seeds: the same prompts and seeds as sync mode, so a
pipeline run trains on the same prompts as a sync run of as many steps. Past the run's own
batches (groups dropped as too stale, or filtered by dynamic sampling, are replaced) the stream
goes on with the sampler's next epochs, so it never runs dry.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import DistributedSampler

from grpo_lightning.rollout.seeding import sample_seed


class PromptStream:
    """Ordinal -> (index into the records, the record), drawn lazily epoch by epoch of ``sampler``."""

    def __init__(self, records: list[dict], sampler: Callable[[], DistributedSampler], prompts_per_step: int):
        self.records = records
        self._sampler = sampler
        self.prompts_per_step = prompts_per_step
        self._order: list[int] = []  # record indices of the ordinals drawn so far
        self._epoch = 0

    def index(self, ordinal: int) -> int:
        """The record index of prompt ``ordinal`` (the sampler's stream, extended by its next epochs)."""
        while ordinal >= len(self._order):
            sampler = self._sampler()
            sampler.set_epoch(self._epoch)
            self._order.extend(int(i) for i in sampler)
            self._epoch += 1
        return self._order[ordinal]

    def record(self, ordinal: int) -> dict:
        return self.records[self.index(ordinal)]

    def seeds(self, run_seed: int, rank: int, ordinal: int, num_generations: int) -> list[int]:
        """The sync run's seeds of this prompt: (run seed, rank, its step, its place in the step, sample)."""
        step, place = divmod(ordinal, self.prompts_per_step)
        return [sample_seed(run_seed, rank, step, place, j) for j in range(num_generations)]
