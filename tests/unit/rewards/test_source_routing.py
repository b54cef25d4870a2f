"""Mixed-task scoring: each sample scored by its own source's rewards, metrics kept per source."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_lightning.errors import RewardError
from grpo_lightning.rewards import RewardScorer, WeightedReward
from grpo_lightning.rewards.routing import CORRECTNESS, SourceRouter, source_reward_metrics


def length(prompts, completions, **_):
    return [float(len(c)) for c in completions]


def exact(prompts, completions, answer, **_):
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def router() -> SourceRouter:
    return SourceRouter(
        {
            "a": RewardScorer([WeightedReward("exact", exact, 2.0)]),
            "b": RewardScorer([WeightedReward("length", length, 0.5), WeightedReward("exact", exact, 1.0)]),
        },
        {"a": "exact", "b": None},
    )


def test_every_sample_gets_its_own_sources_rewards_for_random_mixes():
    rng = random.Random(0)
    routed = router()
    for _ in range(50):
        n = rng.randint(1, 12)
        sources = [rng.choice("ab") for _ in range(n)]
        answers = [str(rng.randint(0, 3)) for _ in range(n)]
        completions = [str(rng.randint(0, 3)) * rng.randint(1, 3) for _ in range(n)]
        total, parts = routed(["p"] * n, completions, {"data_source": sources, "answer": answers})
        for i in range(n):
            right = float(completions[i] == answers[i])
            want = 2.0 * right if sources[i] == "a" else 0.5 * len(completions[i]) + right
            assert total[i].item() == pytest.approx(want)
            assert math.isnan(parts["length"][i]) == (sources[i] == "a")  # length does not score source a
            assert parts["exact"][i].item() == right
            assert math.isnan(parts[CORRECTNESS][i]) == (sources[i] == "b")  # b names no correctness reward


def test_a_row_of_an_unknown_source_is_refused_naming_the_sources():
    with pytest.raises(RewardError, match=r"data_source=\['c'\].*\['a', 'b'\]"):
        router()(["p", "p"], ["1", "2"], {"data_source": ["a", "c"], "answer": ["1", "2"]})


def test_per_sample_extras_are_split_with_their_rows():
    seen = {}

    def ids(prompts, completions, completion_ids, **_):
        seen[completions[0]] = completion_ids
        return [0.0] * len(completions)

    routed = SourceRouter({s: RewardScorer([WeightedReward("ids", ids)]) for s in "ab"})
    routed(["p"] * 3, ["x", "y", "z"], {"data_source": ["a", "b", "a"]}, completion_ids=[[1], [2], [3]])
    assert seen == {"x": [[1], [3]], "y": [[2]]}


def test_the_evaluators_router_scores_only_each_sources_correctness():
    judge = router().for_correctness()
    assert list(judge.sources) == ["a"]
    total, parts = judge(["p"], ["1"], {"data_source": ["a"], "answer": ["1"]})
    assert parts[CORRECTNESS].tolist() == [1.0] and total.tolist() == [1.0]


def test_source_metrics_average_each_source_apart():
    rewards = torch.tensor([1.0, 3.0, 10.0, 20.0])
    components = {
        "exact": torch.tensor([1.0, 0.0, math.nan, math.nan]),
        "length": torch.tensor([math.nan] * 2 + [4, 6]),
    }
    metrics = source_reward_metrics(["a", "a", "b", "b"], rewards, components)
    assert metrics["reward/a/mean"] == 2.0 and metrics["reward/b/mean"] == 15.0
    assert metrics["reward/a/exact/mean"] == 0.5 and metrics["reward/b/length/mean"] == 5.0
    assert "reward/a/length/mean" not in metrics and "reward/b/exact/mean" not in metrics
    assert metrics["reward/a/share"] == 0.5
    assert source_reward_metrics([], rewards, components) == {}


def test_what_each_sources_functions_log_reaches_the_router_row_by_row():
    """TRL's log_metric / log_extra inside a mixed run: the router reports them for the whole batch
    (the generator reads ``scorer.last_logs``), each extra value on the row that produced it."""

    def tagged(completions, log_extra, log_metric, **_):
        log_extra("seen", [f"a:{c}" for c in completions])
        log_metric("calls", 1.0)
        return [1.0] * len(completions)

    routed = SourceRouter({"a": RewardScorer([WeightedReward("tagged", tagged)]), "b": router().sources["b"]})
    sources = ["b", "a", "b", "a"]
    completions = ["x", "y", "zz", "w"]
    fields = {"data_source": sources, "answer": ["0"] * 4}
    routed(["p"] * 4, completions, fields)
    assert routed.last_logs.extra["seen"] == [None, "a:y", None, "a:w"]
    assert routed.last_logs.metrics == {"reward/calls": 1.0}
