"""The cross-rank metrics (torchmetrics): exact against direct formulas, and exact when split over ranks."""

from __future__ import annotations

import math
import random

import torch

from grpo_lightning.records import PassStats, RolloutBatch
from grpo_lightning.step.metrics import StepTotals
from grpo_lightning.step.reductions import StepStats, ValidationMeans


def random_rollout(rng: random.Random, groups: int, group_size: int, names=("a", "b")) -> RolloutBatch:
    n, width = groups * group_size, 6
    lengths = [rng.randint(1, width) for _ in range(n)]
    mask = torch.tensor([[1] * k + [0] * (width - k) for k in lengths])
    components = {}
    for name in names:
        values = torch.tensor([float(rng.choice([0, 0.5, 1, 2])) for _ in range(n)])
        values[torch.rand(n, generator=torch.Generator().manual_seed(rng.randint(0, 99))) < 0.2] = math.nan
        components[name] = values
    rewards = torch.tensor([float(rng.choice([0, 1])) for _ in range(n)])
    return RolloutBatch(
        prompt_ids=torch.ones(n, 3, dtype=torch.long),
        prompt_mask=torch.tensor([[0, 1, 1]] * n),
        completion_ids=mask.clone(),
        completion_mask=mask,
        rewards=rewards,
        group_size=group_size,
        max_new_tokens=width,
        temperature=1.0,
        reward_components=components,
        finished=torch.tensor([k < width for k in lengths]),
    )


def pass_stats(tokens: float, entropy: float) -> PassStats:
    return PassStats(kept_tokens=tokens, entropy_sum=entropy, kl_sum=tokens * 0.1)


def test_step_stats_match_the_direct_formulas_over_random_batches():
    rng = random.Random(0)
    for _ in range(30):
        rollout = random_rollout(rng, groups=rng.randint(1, 4), group_size=rng.choice([2, 4]))
        stats = StepStats(tuple(rollout.reward_components))
        stats.update(rollout, pass_stats(10.0, 25.0))
        out = stats.compute()
        lengths = rollout.completion_mask.sum(1).float()
        grouped = rollout.rewards.view(-1, rollout.group_size)
        assert math.isclose(out["reward/std"], float(grouped.std(dim=1).mean()), abs_tol=1e-6)  # within-group
        assert math.isclose(out["completions/mean_length"], float(lengths.mean()), abs_tol=1e-6)
        assert out["completions/min_length"] == lengths.min() and out["completions/max_length"] == lengths.max()
        assert math.isclose(out["completions/clipped_ratio"], float((~rollout.finished).float().mean()), abs_tol=1e-6)
        assert out["num_tokens_step"] == float(rollout.prompt_mask.sum() + lengths.sum())
        assert math.isclose(out["policy/entropy"], 2.5) and math.isclose(out["kl/mean"], 0.1)
        for name, values in rollout.reward_components.items():
            applied = values[~values.isnan()]
            if applied.numel():
                assert math.isclose(out[f"reward/{name}/mean"], float(applied.mean()), abs_tol=1e-6)
            if applied.numel() > 1:
                assert math.isclose(out[f"reward/{name}/std"], float(applied.std()), abs_tol=1e-5)


def test_step_stats_split_over_ranks_equal_the_whole_batch():
    """Two 'ranks' merged with the states' own reduction (sum, max) give the statistics of both halves."""
    rng = random.Random(1)
    for _ in range(20):
        a, b = random_rollout(rng, 2, 4), random_rollout(rng, 3, 4)
        rank0, rank1 = StepStats(("a", "b")), StepStats(("a", "b"))
        rank0.update(a, pass_stats(5.0, 5.0))
        rank1.update(b, pass_stats(15.0, 45.0))
        rank0.merge_state(rank1)
        merged = rank0.compute()
        lengths = torch.cat([a.completion_mask.sum(1), b.completion_mask.sum(1)]).float()
        assert merged["completions/max_length"] == lengths.max() and merged["completions/min_length"] == lengths.min()
        assert math.isclose(merged["policy/entropy"], 50.0 / 20.0)
        both = torch.cat([a.reward_components["a"], b.reward_components["a"]])
        assert math.isclose(merged["reward/a/mean"], float(both[~both.isnan()].mean()), abs_tol=1e-6)
        stds = torch.cat([a.rewards.view(-1, 4).std(1), b.rewards.view(-1, 4).std(1)])
        assert math.isclose(merged["reward/std"], float(stds.mean()), abs_tol=1e-6)


def test_num_tokens_accumulates_and_survives_a_checkpoint():
    rng = random.Random(2)
    totals = StepTotals()
    batches = [random_rollout(rng, 2, 2) for _ in range(3)]
    for rollout in batches:
        out = totals.measure(rollout, pass_stats(1.0, 1.0))
    expected = sum(float(r.prompt_mask.sum() + r.completion_mask.sum()) for r in batches)
    assert out["num_tokens"] == expected
    restored = StepTotals()
    restored.load_state_dict(totals.state_dict())
    assert restored.num_tokens == expected


def test_validation_means_weight_batches_by_prompts_and_reset():
    means = ValidationMeans()
    with torch.inference_mode():  # Lightning's validate(); fit's validation runs under no_grad
        means.update({"val/accuracy": 1.0}, 3, torch.device("cpu"))
    means.update({"val/accuracy": 0.0}, 1, torch.device("cpu"))
    assert means.compute() == {"val/accuracy": 0.75}  # not the mean of batch means (0.5)
    means.update({"val/accuracy": 0.5}, 2, torch.device("cpu"))
    assert means.compute() == {"val/accuracy": 0.5}
