"""``PromptSampler``: seeded prompt order that shards across ranks without changing the epoch length.

Lightning replaces a plain ``RandomSampler`` with its own ``DistributedSampler`` under DDP;
that one ignores ``num_samples`` and our generator, so a run of N steps would silently end
after ``len(dataset) / (world_size x prompts_per_step)`` batches. This sampler *is* a
``DistributedSampler`` (so Lightning leaves it alone) and gives every rank exactly
``num_batches x prompts_per_step`` prompts: all ranks draw the same seeded stream of
permutations and rank r takes every world_size-th prompt of it. Under DDP each permutation
is cut to a whole number of global steps (world_size x batch_size prompts), so one step
never straddles two permutations and the ranks' prompts in a step are distinct (given at
least world_size x batch_size prompts). On one rank the order is exactly that of a seeded
``RandomSampler``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler


class PromptSampler(DistributedSampler):
    def __init__(
        self,
        dataset_size: int,
        num_samples: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        batch_size: int = 1,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        # DistributedSampler.__init__ would query torch.distributed; set its fields directly.
        self.dataset_size = dataset_size
        self.num_samples = num_samples  # per rank
        self.total_size = num_samples * world_size
        self.seed = seed
        self.rank = rank
        self.num_replicas = world_size
        self.epoch = 0
        self.shuffle = True
        self.drop_last = True
        step = world_size * batch_size
        self.chunk = dataset_size if world_size == 1 or dataset_size < step else dataset_size - dataset_size % step

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        stream: list[int] = []
        while len(stream) < self.total_size:
            stream.extend(torch.randperm(self.dataset_size, generator=generator)[: self.chunk].tolist())
        return iter(stream[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
