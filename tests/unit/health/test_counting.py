"""The identical-sample checks count by sorting (issue 46): the same results as comparing every
pair, which they did before (property-tested against that code on random groups), in memory
linear in the group size (it was quadratic: 149 GiB for rollout.num_generations=100000)."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from grpo_lightning.config import HealthConfig
from grpo_lightning.health.counting import count_in, max_where_equal, row_keys
from grpo_lightning.health.diversity import DiversityCheck
from grpo_lightning.health.duplicates import CrossRankDuplicatesCheck


# ----------------------------------------------------------------------------- the code before, pair by pair
def pairwise_diversity(hashes: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    size = hashes.shape[1]
    copies = (hashes[:, :, None] == hashes[:, None, :]).sum(axis=2)
    return {
        "identical_groups": float((copies[:, 0] == size).sum()),
        "distinct": float((1.0 / copies).sum()),
        "dup_obs": float((copies > 1).sum()),
    }


def pairwise_repeats(old, old_p, new, new_p) -> tuple[float, np.ndarray]:
    match = old[:, :, None] == new[:, None, :]
    p_now = (match * new_p[:, None, :]).max(axis=2)
    return float(match.any(axis=1).sum()), p_now


def pairwise_duplicates(local: np.ndarray, others: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    same_prompt = local[:, 0:1] == others[None, :, 0]
    same = same_prompt & (local[:, 1:2] == others[None, :, 1])
    return same.any(axis=1), same_prompt.sum(axis=1)


def random_hashes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Hashes from a pool small enough to repeat often, large values included (int64 extremes)."""
    pool = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=int(rng.integers(1, 2 * cols + 2)))
    return pool[rng.integers(0, len(pool), size=(rows, cols))]


def random_probs(rng: np.random.Generator, shape) -> np.ndarray:
    probs = rng.random(shape)
    probs[rng.random(shape) < 0.2] = 0.0
    probs[rng.random(shape) < 0.1] = 1.0
    return probs


# ----------------------------------------------------------------------------- properties
def test_sorting_counts_what_comparing_every_pair_counts():
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows, cols = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        hashes, probs = random_hashes(rng, rows, cols), random_probs(rng, (rows, cols))
        keys = row_keys(hashes)
        copies = count_in(keys, keys)
        assert np.array_equal(copies, (hashes[:, :, None] == hashes[:, None, :]).sum(axis=2))
        old_cols = int(rng.integers(1, 40))
        taken = hashes[np.arange(rows)[:, None], rng.integers(0, cols, size=(rows, old_cols))]
        old = np.where(rng.random((rows, old_cols)) < 0.6, taken, random_hashes(rng, rows, old_cols))  # repeats
        old_p = random_probs(rng, (rows, old_cols))
        both = row_keys(np.concatenate([old, hashes], axis=1))
        old_keys, new_keys = both[:, :old_cols], both[:, old_cols:]
        obs, p_now = pairwise_repeats(old, old_p, hashes, probs)
        assert float((count_in(old_keys, new_keys) > 0).sum()) == obs
        assert np.array_equal(max_where_equal(new_keys, probs, old_keys), p_now)


def view_of(hashes: np.ndarray, probs: np.ndarray, prompts: np.ndarray, **extra) -> SimpleNamespace:
    return SimpleNamespace(
        group_size=hashes.shape[1],
        completion_hashes=hashes.ravel(),
        sample_probs=probs.ravel(),
        group_prompt_hashes=prompts,
        prompt_hashes=np.repeat(prompts, hashes.shape[1]),
        **extra,
    )


def test_the_diversity_check_measures_what_it_measured_pair_by_pair():
    """Whole steps, the cross-step memory included: a prompt returns with new completions."""
    for case in range(40):
        rng = np.random.default_rng(case)
        check = DiversityCheck(HealthConfig().diversity)
        previous: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        size = int(rng.integers(2, 12))
        for _ in range(4):
            groups = int(rng.integers(1, 5))
            prompts = rng.integers(0, 6, size=groups)
            prompts = np.unique(prompts)  # a step's prompts differ
            hashes, probs = random_hashes(rng, len(prompts), size), random_probs(rng, (len(prompts), size))
            stats = check.measure(view_of(hashes, probs, prompts))
            expected = pairwise_diversity(hashes, probs)
            rows = [i for i, p in enumerate(prompts.tolist()) if p in previous]
            if rows:
                old = np.stack([previous[int(prompts[i])][0] for i in rows])
                old_p = np.stack([previous[int(prompts[i])][1] for i in rows])
                obs, p_now = pairwise_repeats(old, old_p, hashes[rows], probs[rows])
                expected["repeat_obs"] = obs
                expected["repeat_exp"] = float(size * np.minimum(np.maximum(old_p, p_now).sum(axis=1), 1.0).sum())
            for i, p in enumerate(prompts.tolist()):
                previous[int(p)] = (hashes[i], probs[i])
            for key, value in expected.items():
                assert stats[key] == pytest.approx(value, rel=1e-12, abs=0), (case, key)


def test_the_cross_rank_check_measures_what_it_measured_pair_by_pair():
    for case in range(100):
        rng = np.random.default_rng(1000 + case)
        world, rank = int(rng.integers(2, 5)), 0
        size, groups = int(rng.integers(1, 8)), int(rng.integers(1, 5))
        shards = []
        for _ in range(world):
            prompts = rng.integers(0, 4, size=groups)
            hashes = rng.integers(0, 5, size=(groups, size))  # few values: twins on other ranks are common
            shards.append((hashes, random_probs(rng, (groups, size)), prompts))
        hashes, probs, prompts = shards[rank]

        rest = [np.stack([np.repeat(p, size), h.ravel(), pr.ravel().view(np.int64)], axis=1) for h, pr, p in shards[1:]]

        def gather(local: np.ndarray, rest=rest) -> np.ndarray:
            return np.stack([local, *rest])

        view = view_of(hashes, probs, prompts, world_size=world, rank=rank, all_gather=gather)
        stats = CrossRankDuplicatesCheck(HealthConfig().duplicates).measure(view)
        mine = np.stack([np.repeat(prompts, size), hashes.ravel(), probs.ravel().view(np.int64)], axis=1)
        gathered = gather(mine)
        twins, num_others = pairwise_duplicates(gathered[0], np.concatenate(list(gathered[1:])))
        assert stats["dup_obs"] == float(twins.sum()) and stats["shared"] == float((num_others > 0).sum())
        assert stats["dup_exp"] == pytest.approx(float(np.minimum(num_others * probs.ravel(), 1.0).sum()), rel=1e-12)


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("check_cls", [DiversityCheck, CrossRankDuplicatesCheck])
def test_no_check_allocates_quadratically_in_the_group_size(check_cls):
    """A group of 20 000 (pairwise: 400 million comparisons, 800 MB of booleans for two groups)."""
    rng = np.random.default_rng(0)
    size, groups = 20_000, 2
    hashes, probs = random_hashes(rng, groups, size), random_probs(rng, (groups, size))
    prompts = np.arange(groups)
    local = np.stack([np.repeat(prompts, size), hashes.ravel(), probs.ravel().view(np.int64)], axis=1)
    view = view_of(hashes, probs, prompts, world_size=2, rank=0, all_gather=lambda a: np.stack([a, local]))
    check = check_cls(getattr(HealthConfig(), check_cls.name))
    tracemalloc.start()
    try:
        check.measure(view)
        check.measure(view)  # the diversity check's memory: every prompt returns
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 400 * size * groups, f"{peak / 2**20:.0f} MiB for {size * groups} samples"
