"""Regression: switching the task from Python kept the old task's dependent fields.

``cfg.task = TaskConfig(name="dataset", ...)`` kept ``correctness_reward=arithmetic_exact`` and
the arithmetic rewards, and the run crashed reading an ``answer`` column the file does not have.
Now a switch (``cfg.task = "gsm"``, or a ``TaskConfig(name=...)``) gives the task's options as
``task=<name>`` composes them, keeping only the fields the caller set."""

from __future__ import annotations

import dataclasses
import json

import pytest

from grpo_lightning.build import build_datamodule
from grpo_lightning.config import ConfigError, TaskConfig, TrainConfig, validate_config
from grpo_lightning.config.compose import compose

OUT = "trainer.output_dir=/tmp/unused"


def test_switching_by_name_gives_the_options_the_cli_composes():
    for name in ("gsm", "dataset", "reasoning_gym", "arithmetic"):
        cfg = TrainConfig()
        cfg.task = name
        assert dataclasses.asdict(cfg.task) == dataclasses.asdict(compose([OUT, f"task={name}"])[0].task), name


def test_a_switch_keeps_only_what_the_caller_set():
    cfg = TrainConfig()
    cfg.task = TaskConfig(name="gsm", max_completion_chars=50)
    assert cfg.task.correctness_reward == "gsm_exact" and "arithmetic_exact" not in cfg.task.rewards
    assert cfg.task.max_completion_chars == 50
    validate_config(cfg)


def test_a_dataset_switched_to_from_python_builds(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "solution": str(i + 1)}) + "\n" for i in range(16)))
    cfg = TrainConfig()
    cfg.trainer.output_dir = str(tmp_path / "out")
    cfg.rollout.prompts_per_step = 4
    cfg.task = TaskConfig(name="dataset", rewards={"answer_format": 1.0})
    cfg.task.path = str(data)
    assert cfg.task.correctness_reward is None  # arithmetic_exact would read an 'answer' column
    validate_config(cfg)
    assert len(build_datamodule(cfg).train_records) == 16


def test_a_task_given_at_construction_is_promoted_when_the_run_is_built():
    cfg = TrainConfig(task=TaskConfig(name="gsm"))
    cfg.task = cfg.task.promoted()  # what build_run does first
    assert cfg.task.correctness_reward == "gsm_exact"


def test_renaming_the_task_alone_says_how_to_switch():
    cfg = TrainConfig()
    cfg.task.name = "gsm"
    with pytest.raises(ConfigError, match=r"in Python: cfg.task = 'gsm'"):
        validate_config(cfg)
