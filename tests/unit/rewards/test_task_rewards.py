"""Every task's rewards on known right, wrong and malformed completions (no tag, non-numeric, empty)."""

from __future__ import annotations

import warnings

import pytest

from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rewards.answers import extract_answer, parse_number
from grpo_lightning.rewards.generic import answer_format, length_penalty
from grpo_lightning.tasks import reasoning_gym as rg
from grpo_lightning.tasks.gsm import gsm_exact
from grpo_lightning.tasks.reasoning_gym import reasoning_gym_correct, reasoning_gym_records


def test_answer_extraction_prefers_the_tag_then_the_last_number():
    assert extract_answer("I think 3. <answer>7</answer>") == "7"
    assert extract_answer("<answer> 1 </answer> then <answer>2</answer>") == "2"
    assert extract_answer("5 - 3 = 2") == "2"
    assert extract_answer("no digits here") is None
    assert extract_answer("") is None
    assert parse_number("$1,200.00") == 1200.0
    assert parse_number("-4 apples") == -4.0
    assert parse_number("twelve") is None


def test_answer_format_needs_exactly_one_non_empty_final_tag():
    completions = [
        "<answer>7</answer>",
        "Let me add: 3 + 4 = 7.\n<answer>7</answer>  ",
        "7",  # no tag
        "<answer></answer>",  # empty
        "<answer>7</answer> and more text",  # trailing text
        "<answer>7</answer><answer>8</answer>",  # two answers
        "<answer>7",  # unclosed
        "",
    ]
    assert answer_format([""] * len(completions), completions) == [1, 1, 0, 0, 0, 0, 0, 0]


def test_gsm_exact_matches_numbers_not_strings():
    completions = [
        "<answer>36</answer>",
        "So she gets 36 points.",  # no tag: the last number counts
        "<answer>36.0</answer>",
        "<answer>1,200</answer>",
        "<answer>35</answer>",
        "<answer>thirty-six</answer>",  # non-numeric
        "I am not sure.",
        "",
        "<answer>36</answer> wait, 40",  # the tag wins over later numbers
    ]
    answers = ["36", "36", "36", "1200", "36", "36", "36", "36", "36"]
    assert gsm_exact([""] * len(completions), completions, answer=answers) == [1, 1, 1, 1, 0, 0, 0, 0, 1]


@pytest.fixture(scope="module")
def arithmetic_entries():
    train, _ = reasoning_gym_records(
        "basic_arithmetic",
        8,
        seed=0,
        val_fraction=0.0,
        options={"min_terms": 2, "max_terms": 2, "allow_negation": False, "allow_parentheses": False},
    )
    return train


def test_reasoning_gym_reward_uses_the_datasets_own_scoring(arithmetic_entries):
    entry = arithmetic_entries[0]
    right, wrong = entry["answer"], str(int(entry["answer"]) + 1)
    completions = [
        f"<answer>{right}</answer>",
        f"The result is {right}.",  # no tag
        f"<answer>{wrong}</answer>",
        "<answer>banana</answer>",  # non-numeric
        "",
    ]
    scores = reasoning_gym_correct([""] * 5, completions, entry=[entry["entry"]] * 5)
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_reasoning_gym_reward_on_every_generated_problem(arithmetic_entries):
    entries = [r["entry"] for r in arithmetic_entries]
    right = [f"<answer>{r['answer']}</answer>" for r in arithmetic_entries]
    assert reasoning_gym_correct([""] * len(entries), right, entry=entries) == [1.0] * len(entries)
    shifted = right[1:] + right[:1]
    wrong = [a != b for a, b in zip(right, shifted, strict=True)]
    scores = reasoning_gym_correct([""] * len(entries), shifted, entry=entries)
    assert [s == 0.0 for s in scores] == wrong


def test_length_penalty_grows_past_the_limit_and_is_capped():
    completions = ["x" * 10, "x" * 20, "x" * 30, "x" * 100, ""]
    assert length_penalty([""] * 5, completions, max_completion_chars=[20] * 5) == [0, 0, -0.5, -1.0, 0]
    assert length_penalty([""] * 2, ["x" * 500, ""]) == [0, 0]  # no limit: off


def test_task_rewards_combine_with_weights():
    scorer = RewardScorer.from_names({"gsm_exact": 1.0, "answer_format": 0.2, "length_penalty": 0.5})
    fields = {"answer": ["4", "4", "4"], "max_completion_chars": [20, 20, 20]}
    total, parts = scorer(["q"] * 3, ["<answer>4</answer>", "4", "<answer>5</answer>" + " " * 30], fields)
    # third: wrong (0), well-formed tag (0.2), 48 chars > 2 x 20 so the penalty is capped (-1 x 0.5)
    assert total.tolist() == pytest.approx([1.2, 1.0, -0.3])
    assert set(parts) == {"gsm_exact", "answer_format", "length_penalty"}


def test_a_dataset_scorer_that_raises_on_a_malformed_answer_scores_it_zero_and_warns_once(monkeypatch):
    """Regression: prime_factorization's score_answer raises ValueError on "16," and stopped the run."""
    monkeypatch.setattr(rg, "_SCORER_FAILURES_WARNED", set())
    train, _ = reasoning_gym_records("prime_factorization", size=8, val_fraction=0.0, options={"max_value": 30})
    entries = [r["entry"] for r in train[:3]]
    right = [f"<answer>{r['answer']}</answer>" for r in train[:3]]
    malformed = ["<answer>16,</answer>", "<answer>abc</answer>", right[2]]
    with pytest.warns(UserWarning, match=r"prime_factorization score_answer raised ValueError.*'16,'.*score 0"):
        scores = reasoning_gym_correct([""] * 3, malformed, entry=entries)
    assert scores == [0.0, 0.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: no warning, the same scores
        assert reasoning_gym_correct([""] * 3, malformed, entry=entries) == [0.0, 0.0, 1.0]
    assert reasoning_gym_correct([""] * 3, right, entry=entries) == [1.0, 1.0, 1.0]
