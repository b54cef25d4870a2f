"""Math answers compared by math-verify (issue 28, 5b): a table of equivalent and non-equivalent
pairs, the comparison off the main thread, our own deadline in place of its SIGALRM one."""

from __future__ import annotations

import threading
import time

import pytest

from grpo_lightning.rewards import math_answers
from grpo_lightning.rewards.accuracy import math_accuracy, reference_answer
from grpo_lightning.rewards.answers import extract_answer
from grpo_lightning.rewards.math_answers import math_equal
from grpo_lightning.tasks.gsm import gsm_exact
from grpo_lightning.tasks.reasoning_gym import is_numeric

EQUIVALENT = [
    ("1,200", "1200"),
    ("1200.0", "1200"),
    ("$1,200.00", "1200"),
    ("-3.0", "-3"),
    ("0.5", "\\frac{1}{2}"),
    ("\\frac12", "1/2"),
    ("$\\frac{1}{2}$", "0.50"),
    ("0.75", "\\frac{3}{4}"),
    ("\\sqrt{12}", "2\\sqrt{3}"),
    ("2^{1/2}", "\\sqrt{2}"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("\\{2,1\\}", "\\{1,2\\}"),
    ("10\\%", "10"),
    ("12 apples", "12"),
]
NOT_EQUIVALENT = [
    ("1200", "120"),
    ("1,200,000", "1200"),
    ("-1", "1"),
    ("12", "2"),
    ("1/3", "1/2"),
    ("1/3", "0.333"),
    ("\\pi", "3.14159"),
    ("\\sqrt{3}", "3"),
    ("", "7"),
    ("seven", "7"),
]


@pytest.mark.parametrize("guess, truth", EQUIVALENT)
def test_equivalent_forms_are_equal(guess, truth):
    assert math_equal(guess, truth)


@pytest.mark.parametrize("guess, truth", NOT_EQUIVALENT)
def test_different_values_are_not_equal(guess, truth):
    assert not math_equal(guess, truth)


def test_no_answer_is_never_equal():
    assert not math_equal(None, "7") and not math_equal("7", None)


def test_it_works_outside_the_main_thread():
    """math-verify's SIGALRM timeout raises there; ours is a deadline, so the check still runs."""
    results = []
    worker = threading.Thread(target=lambda: results.append([math_equal(g, t) for g, t in EQUIVALENT[4:9]]))
    worker.start()
    worker.join(timeout=60)
    assert results == [[True] * 5]


def test_a_check_past_the_deadline_counts_as_wrong_with_one_warning(monkeypatch):
    monkeypatch.setattr(math_answers, "_verified", lambda guess, truth: time.sleep(1.0) or True)
    monkeypatch.setattr(math_answers, "_warned", False)
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="math-verify took over 0.05 s"):
        assert math_equal("\\frac{1}{2}", "0.5", deadline_s=0.05) is False
    assert time.perf_counter() - start < 0.9  # did not wait for the stuck check
    monkeypatch.undo()
    assert math_equal("\\frac{1}{2}", "0.5")  # a fresh thread serves the next check


def test_untagged_answers_keep_the_lenient_fallback():
    assert extract_answer("so it is 1,234.") == "1,234"
    assert extract_answer("first 3 then \\boxed{\\frac{1}{2}} ok") == "\\frac{1}{2}"
    assert extract_answer("<answer>7</answer> and \\boxed{8}") == "7"
    completions = ["<answer>1,200</answer>", "so \\boxed{\\frac{2400}{2}}", "it is 1200.", "12", "none"]
    assert gsm_exact([""] * 5, completions, ["1200"] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_math_accuracy_reads_the_solution_column_and_skips_rows_without_one():
    conversational = [[{"role": "assistant", "content": "\\boxed{0.5}"}], "1/3", "anything"]
    solutions = ["We get $\\boxed{\\frac12}$.", "Half of it.\n#### 1/2", None]
    assert math_accuracy(completions=conversational, solution=solutions) == [1.0, 0.0, None]
    assert math_accuracy(completions=["<answer>4</answer>"], answer=["4"]) == [1.0]
    assert reference_answer(float("nan")) is None


def test_numeric_reasoning_gym_answers_are_recognized():
    assert is_numeric("12") and is_numeric("-3.5") and is_numeric("3/4")
    assert not is_numeric("A B C") and not is_numeric("[1, 2]")
