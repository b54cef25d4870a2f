"""Reward functions, their registry, and the scorer's errors that name the culprit."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.rewards import RewardFunctionError, RewardScorer, WeightedReward, get_reward
from grpo_lightning.tasks.arithmetic import arithmetic_close, arithmetic_digits, arithmetic_exact


def test_arithmetic_rewards_score_right_wrong_and_malformed_answers():
    completions = ["7", " 7 ", "8", "12", "7+", "", "abc", "-3"]
    answers = ["7", "7", "7", "7", "7", "7", "7", "-3"]
    prompts = [""] * len(completions)
    assert arithmetic_exact(prompts, completions, answer=answers) == [1, 1, 0, 0, 0, 0, 0, 1]
    assert arithmetic_close(prompts, completions, answer=answers) == pytest.approx([1, 1, 0.8, 0, 0, 0, 0, 1])
    assert arithmetic_digits(prompts, ["7", "7+", "17", ""], answer=["7", "7", "12", "7"]) == [1, 0.5, 0.5, 0]


def test_unknown_reward_name_lists_the_registered_ones():
    with pytest.raises(KeyError, match="arithmetic_exact"):
        get_reward("accuracy")


def test_weighted_sum_and_components():
    scorer = RewardScorer.from_names({"arithmetic_exact": 2.0, "arithmetic_close": 0.5})
    total, parts = scorer(["1+1="] * 2, ["2", "3"], {"answer": ["2", "2"]})
    assert torch.allclose(total, torch.tensor([2.0 + 0.5, 0.0 + 0.5 * 0.8]))
    assert set(parts) == {"arithmetic_exact", "arithmetic_close"}


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda p, c, **_: 1 / 0, "'bad' raised ZeroDivisionError"),
        (lambda p, c, **_: [1.0], "'bad' returned 1 values for 2 completions"),
        (lambda p, c, **_: [1.0, float("nan")], "'bad' returned non-finite values at completions \\[1\\]"),
        (lambda p, c, **_: ["x", "y"], "'bad' must return a list of floats"),
    ],
)
def test_misbehaving_reward_function_is_named(fn, message):
    scorer = RewardScorer([WeightedReward("bad", fn)])
    with pytest.raises(RewardFunctionError, match=message):
        scorer(["a", "b"], ["1", "2"], {})
