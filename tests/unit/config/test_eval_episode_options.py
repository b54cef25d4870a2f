"""eval.greedy / eval.samples_per_row belong to episode tasks, eval.pass_k to single-turn ones; each
misuse is one config error naming the field and the way to get what was meant."""

from __future__ import annotations

import pytest

from grpo_lightning.config import ConfigError, validate_config
from grpo_lightning.config.compose import compose


def problems(*overrides: str) -> str:
    cfg, _ = compose([*overrides, "trainer.output_dir=."])
    try:
        validate_config(cfg)
    except ConfigError as err:
        return str(err)
    return ""


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (("eval.greedy=false",), "eval.greedy=false: task=arithmetic is single-turn"),
        (("eval.samples_per_row=4",), "eval.samples_per_row=4: task=arithmetic is single-turn"),
        (("task=guess_number", "eval.pass_k=4"), "eval.greedy=false eval.samples_per_row=4 (val/pass@4)"),
        (("task=guess_number", "task.success_reward=nope"), "task.success_reward='nope' is not in task.rewards"),
        (("task=guess_number", "eval.samples_per_row=0"), "eval.samples_per_row=0 must be >= 1"),
        (("task=guess_number", "task.group_column=kind"), "task.group_column='kind': episode tasks report"),
    ],
)
def test_misused_evaluation_options_are_refused_naming_the_fix(overrides, expected):
    assert expected in problems(*overrides)


def test_episode_tasks_take_the_sampled_held_out_options():
    assert problems("task=guess_number", "eval.greedy=false", "eval.samples_per_row=16") == ""
    assert problems("task=guess_number", "task.success_reward=environment") == ""
