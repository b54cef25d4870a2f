"""task=episodes: an environment by name plus the rows of any file task=dataset reads, each row handed to
reset as it is (no prompt column needed)."""

from __future__ import annotations

import json

from grpo_lightning.build import build_datamodule
from grpo_lightning.config.compose import compose
from grpo_lightning.tasks.base import task_records
from grpo_lightning.tasks.episodes import EpisodesTaskConfig


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_rows_reach_the_environment_as_they_are_split_or_from_val_path(tmp_path):
    rows = [{"level": i, "board": [i, i + 1], "meta": {"k": "v"}} for i in range(20)]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    train, val = task_records(EpisodesTaskConfig(environment="guess_number", path=path, val_fraction=0.25))
    assert len(train) == 15 and len(val) == 5
    assert sorted(train + val, key=lambda r: r["level"]) == rows  # unchanged: no prompt column added
    held = write_rows(tmp_path / "val.jsonl", rows[:3])
    train, val = task_records(EpisodesTaskConfig(environment="guess_number", path=path, val_path=held))
    assert train == rows and val == rows[:3]


def test_the_cli_composes_it_and_the_data_module_keeps_rows_without_a_prompt(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"level": i} for i in range(40)])
    cfg, _ = compose(
        ["task=episodes", "task.environment=guess_number", f"task.path={path}", "task.env_args={size: 3}"]
        + [f"trainer.output_dir={tmp_path}/run"]
    )
    assert cfg.task.rewards == {"environment": 1.0} and cfg.task.correctness_reward is None
    assert cfg.task.env_args == {"size": 3}
    data = build_datamodule(cfg)
    assert len(data.train_records) == 32 and len(data.val_records) == 8  # held out for val/*


def test_a_missing_environment_or_path_names_the_option_and_the_fix():
    (problem,) = EpisodesTaskConfig(path="rows.jsonl").check_fields("task.")
    assert "task=episodes needs task.environment=NAME" in problem and "plugins=[my_env.py]" in problem
    problems = EpisodesTaskConfig(environment="guess_number").check_fields("task.")
    assert problems == [problems[0]] and "task=episodes needs task.path=PATH" in problems[0]
