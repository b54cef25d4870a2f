"""PromptSampler: disjoint prompts per rank, a fixed epoch length, one-rank order unchanged."""

from __future__ import annotations

import torch
from torch.utils.data import RandomSampler

from grpo_lightning.data.sampler import PromptSampler


def test_ranks_get_disjoint_prompts_per_step_and_the_same_count():
    ranks = [list(PromptSampler(80, 160, seed=3, rank=r, world_size=2, batch_size=16)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 160
    for step in range(160 // 16):
        a, b = ranks[0][16 * step : 16 * step + 16], ranks[1][16 * step : 16 * step + 16]
        assert not set(a) & set(b), f"step {step}: both ranks got {set(a) & set(b)}"


def test_one_rank_order_is_the_seeded_random_sampler_order():
    expected = list(RandomSampler(range(80), num_samples=200, generator=torch.Generator().manual_seed(5)))
    assert list(PromptSampler(80, 200, seed=5)) == expected


def test_epoch_changes_the_order():
    sampler = PromptSampler(80, 32, seed=0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
