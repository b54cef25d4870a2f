"""task=code: its records' assert tests pass for right functions and fail for wrong ones."""

from __future__ import annotations

import pytest

from grpo_lightning.config import validate_config
from grpo_lightning.config.compose import compose
from grpo_lightning.rewards import REWARD_FUNCTIONS
from grpo_lightning.tasks.code import FAMILIES, CodeTaskConfig, code_records

SOLUTIONS = {
    "add_k": "def add_k(x):\n    return x + {k}",
    "times_k": "def times_k(x):\n    return x * {k}",
    "divisible_by_k": "def divisible_by_k(n):\n    return n % {k} == 0",
    "count_k": "def count_k(s):\n    return s.count('{k}')",
    "first_k": "def first_k(xs):\n    return xs[:{k}]",
    "square_plus_k": "def square_plus_k(x):\n    return x * x + {k}",
    "sum_above_k": "def sum_above_k(xs):\n    return sum(x for x in xs if x > {k})",
    "repeat_k": "def repeat_k(s):\n    return s * {k}",
}

pytestmark = pytest.mark.xdist_group("sandbox")  # runs the sandbox: beside its leak checks


def test_records_are_distinct_and_split():
    train, val = code_records(max_k=9)
    assert len(train) + len(val) == 9 * len(FAMILIES)
    assert len({r["prompt"] for r in train + val}) == len(train) + len(val)
    assert all(r["tests"] and all(t.startswith("assert ") for t in r["tests"]) for r in train)


def test_right_functions_pass_and_wrong_ones_fail():
    train, val = code_records(max_k=3)
    records = {r["function"]: r for r in train + val if r["k"] == 3}
    names = sorted(records)
    assert len(names) == len(FAMILIES)
    k = 3
    right = [f"```python\n{SOLUTIONS[n].format(k=k)}\n```" for n in names]
    wrong = [f"```python\n{SOLUTIONS[n].format(k=k + 1)}\n```" for n in names]
    tests = [records[n]["tests"] for n in names]
    reward = REWARD_FUNCTIONS["code_tests"]
    assert reward(prompts=names, completions=right, tests=tests) == [1.0] * len(names)
    assert reward(prompts=names, completions=wrong, tests=tests) == [0.0] * len(names)


def test_the_task_composes_with_its_own_rewards(tmp_path):
    cfg, _ = compose([f"trainer.output_dir={tmp_path}", "task=code"])
    validate_config(cfg)
    assert isinstance(cfg.task, CodeTaskConfig) and cfg.task.max_k == 9
    assert cfg.task.rewards == {"code_tests": 1.0} and cfg.task.correctness_reward == "code_tests"
