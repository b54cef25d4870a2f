"""Mixed-task data: prompts drawn by source weight, held-out prompts batched source by source.

:class:`MixtureSampler` is a :class:`~grpo_lightning.data.sampler.PromptSampler` (so Lightning
leaves it alone under DDP and a run of N steps stays N batches) whose stream first draws each
prompt's source with probability ``weight / sum(weights)``, then the source's next prompt from
its own seeded permutations. The stream is a function of the seed alone, so the resumable
loader restores it by skipping the batches already trained on, exactly as for one source.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from grpo_lightning.data.sampler import PromptSampler
from grpo_lightning.errors import ConfigError

SOURCE_COLUMN = "data_source"  # the column that names a row's source (verl's name for it)


def source_of(record: dict) -> str | None:
    return record.get(SOURCE_COLUMN)


class MixtureSampler(PromptSampler):
    def __init__(
        self,
        sources: list[str | None],
        weights: dict[str, float],
        num_samples: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        batch_size: int = 1,
    ):
        super().__init__(len(sources), num_samples, seed, rank, world_size, batch_size)
        self.names = [name for name, w in weights.items() if w > 0]
        self.members = {name: [i for i, s in enumerate(sources) if s == name] for name in self.names}
        empty = [name for name, rows in self.members.items() if not rows]
        if empty:
            raise ConfigError(f"task.sources {empty} have a sampling weight but no training prompts")
        self.weights = torch.tensor([float(weights[name]) for name in self.names], dtype=torch.float64)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        choices = torch.multinomial(self.weights, self.total_size, replacement=True, generator=generator).tolist()
        queues: dict[int, list[int]] = {k: [] for k in range(len(self.names))}
        stream = []
        for k in choices:
            if not queues[k]:  # the source's next seeded permutation, reversed to pop from the end
                rows = self.members[self.names[k]]
                queues[k] = [rows[i] for i in reversed(torch.randperm(len(rows), generator=generator).tolist())]
            stream.append(queues[k].pop())
        return iter(stream[self.rank : self.total_size : self.num_replicas])


def head_per_source(records: list[dict], n: int) -> list[dict]:
    """The first ``n`` records of each source (of all records when they name no source)."""
    counts: dict[str | None, int] = {}
    kept = []
    for record in records:
        source = source_of(record)
        if counts.get(source, 0) < n:
            counts[source] = counts.get(source, 0) + 1
            kept.append(record)
    return kept


def source_batches(records: list[dict], batch_size: int) -> list[list[dict]]:
    """Batches of at most ``batch_size`` records, each of one source, in the records' order of
    sources: a batch's ``val/<source>/...`` then averages over that source's prompts alone."""
    by_source: dict[str | None, list[dict]] = {}
    for record in records:
        by_source.setdefault(source_of(record), []).append(record)
    return [rows[i : i + batch_size] for rows in by_source.values() for i in range(0, len(rows), batch_size)]
