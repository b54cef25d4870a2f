"""Mixed-task sampling: the realized mix follows the weights, is seeded, and resumes exactly."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils.data import DataLoader

from grpo_lightning.data import PromptDataModule
from grpo_lightning.data.mixture import MixtureSampler, head_per_source, source_batches
from grpo_lightning.data.resumable import ResumableLoader
from grpo_lightning.errors import ConfigError

SOURCES = ["a"] * 30 + ["b"] * 7 + ["c"] * 50


def test_the_realized_mix_follows_the_weights_over_many_draws():
    for seed, weights in [(0, {"a": 3.0, "b": 1.0, "c": 0.0}), (1, {"a": 1.0, "b": 1.0, "c": 2.0})]:
        draws = list(MixtureSampler(SOURCES, weights, 40_000, seed=seed))
        counts = Counter(SOURCES[i] for i in draws)
        total = sum(weights.values())
        for source, weight in weights.items():
            assert counts[source] / len(draws) == pytest.approx(weight / total, abs=0.01)


def test_each_source_goes_through_all_its_prompts_before_repeating_one():
    draws = [i for i in MixtureSampler(SOURCES, {"a": 1.0, "b": 1.0}, 200, seed=3)]
    b_rows = [i for i in draws if SOURCES[i] == "b"]
    for start in range(0, len(b_rows) - 7, 7):
        assert sorted(b_rows[start : start + 7]) == list(range(30, 37))


def test_the_stream_is_seeded_and_ranks_split_it():
    weights = {"a": 2.0, "b": 1.0}
    one = list(MixtureSampler(SOURCES, weights, 64, seed=5))
    assert one == list(MixtureSampler(SOURCES, weights, 64, seed=5))
    assert one != list(MixtureSampler(SOURCES, weights, 64, seed=6))
    ranks = [list(MixtureSampler(SOURCES, weights, 32, seed=5, rank=r, world_size=2)) for r in range(2)]
    assert ranks[0] == one[0::2] and ranks[1] == one[1::2]


def test_a_resumed_loader_continues_the_same_mix():
    records = [{"prompt": f"p{i}", "data_source": s} for i, s in enumerate(SOURCES)]
    data = PromptDataModule(records, prompts_per_step=4, seed=7, num_batches=25, source_weights={"a": 1.0, "c": 3.0})
    full = [[r["prompt"] for r in batch] for batch in data.train_dataloader()]
    resumed = data.train_dataloader()
    assert isinstance(resumed, ResumableLoader)
    resumed.load_state_dict({"batches_done": 10})
    assert [[r["prompt"] for r in batch] for batch in resumed] == full[10:]
    assert {r["data_source"] for batch in data.train_dataloader() for r in batch} == {"a", "c"}


def test_a_weighted_source_without_prompts_is_refused():
    with pytest.raises(ConfigError, match=r"\['d'\]"):
        MixtureSampler(SOURCES, {"a": 1.0, "d": 1.0}, 8)


def test_held_out_prompts_are_capped_and_batched_per_source():
    records = [{"prompt": str(i), "data_source": s} for i, s in enumerate("aaabbbbbc")]
    kept = head_per_source(records, 2)
    assert [r["prompt"] for r in kept] == ["0", "1", "3", "4", "8"]
    assert head_per_source([{"prompt": str(i)} for i in range(5)], 3) == [{"prompt": str(i)} for i in range(3)]
    batches = source_batches(records, 2)
    assert [[r["prompt"] for r in b] for b in batches] == [["0", "1"], ["2"], ["3", "4"], ["5", "6"], ["7"], ["8"]]
    loader = PromptDataModule(records, records, prompts_per_step=2, val_batch_size=2).val_dataloader()
    assert isinstance(loader, DataLoader) and [len({r["data_source"] for r in b}) for b in loader] == [1] * 6
