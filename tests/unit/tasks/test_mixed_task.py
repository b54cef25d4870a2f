"""task=mixed: sources become their tasks' options, rows carry data_source, mistakes name the key."""

from __future__ import annotations

import pytest

from grpo_lightning.config import TrainConfig, validate_config
from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.routing import SourceRouter
from grpo_lightning.tasks import MixedTaskConfig, source_weights, task_records, task_scorer


def sources(**extra) -> dict:
    return {
        "sums": {
            "name": "reasoning_gym",
            "size": 20,
            "rewards": {"reasoning_gym": 1.0},
            "weight": 3,
            "correctness_reward": "reasoning_gym",
            "instruction": "Use <answer> tags.",
        },
        "small": {"name": "arithmetic", "max_operand": 4, "rewards": {"arithmetic_close": 1.0}, **extra},
    }


def test_records_carry_their_source_and_its_instruction():
    task = MixedTaskConfig(sources=sources(), val_fraction=0.25)
    assert task.check_fields("task.") == []
    train, val = task_records(task)
    assert {r["data_source"] for r in train} == {"sums", "small"}
    assert all(r["prompt"].endswith("\nUse <answer> tags.") for r in train if r["data_source"] == "sums")
    assert {r["data_source"] for r in val} == {"sums"}  # small names no correctness_reward: not evaluated
    assert source_weights(task) == {"sums": 3.0, "small": 1.0}
    scorer = task_scorer(task)
    assert isinstance(scorer, SourceRouter) and scorer.correctness == {"sums": "reasoning_gym", "small": None}


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        (MixedTaskConfig(), "task.sources is empty"),
        (MixedTaskConfig(sources={"x": {"name": "arithmetic"}}), "task.sources.x.rewards is required"),
        (MixedTaskConfig(sources={"x": {"name": "arithmetik", "rewards": {}}}), "did you mean 'arithmetic'"),
        (MixedTaskConfig(sources=sources(max_operant=3)), "task.sources.small.max_operant is not an option"),
        (MixedTaskConfig(sources=sources(weight=0)), "task.sources.small.weight=0 must be a finite number > 0"),
        (MixedTaskConfig(sources={"x": {"name": "mixed", "rewards": {}}}), "task.sources.x.name=mixed"),
        (MixedTaskConfig(sources=sources(max_operand=-1)), "task.sources.small.max_operand"),
        (MixedTaskConfig(sources=sources(), correctness_reward="reasoning_gym"), "task=mixed takes source_correctness"),
    ],
)
def test_a_bad_source_is_refused_naming_its_key(task, expected):
    problems = task.check_fields("task.")
    assert any(expected in p for p in problems), problems


def test_unknown_reward_names_in_a_source_are_refused_at_config_time():
    bad = sources()
    bad["small"]["rewards"] = {"arithmetic_clos": 1.0}
    with pytest.raises(ConfigError, match=r"task.sources.small.rewards.arithmetic_clos.*arithmetic_close"):
        validate_config(TrainConfig(task=MixedTaskConfig(sources=bad)))
