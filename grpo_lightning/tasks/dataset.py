"""``task=dataset``: your own prompts from a file (``task.path``), read by :mod:`grpo_lightning.data.files`.

A prompt (``task.prompt_column``) is a string or a list of chat messages; every other column
reaches the reward functions as a keyword argument. The rewards are yours: name registered
ones in ``task.rewards`` (e.g. from your own file with ``plugins=[my_rewards.py]``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.data.files import read_records
from grpo_lightning.rewards.columns import check_reward_columns
from grpo_lightning.tasks.base import Check


@dataclass
class DatasetTaskConfig(TaskConfig):
    name: str = task_name("dataset")
    path: str | None = option(
        None, "The training prompts, a .jsonl/.json/.parquet/.csv file or a datasets.save_to_disk folder."
    )
    val_path: str | None = option(None, "Held-out prompts like task.path; null splits task.val_fraction off it.")
    prompt_column: str = option(
        "prompt", "The prompt column (text or chat messages); other columns reach the rewards as kwargs."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(
            problems,
            bool(self.path),
            "task=dataset needs task.path=PATH: a .jsonl, .json, .parquet or .csv file or a datasets.save_to_disk folder",
        )
        return problems


@TASKS.register("dataset", options=DatasetTaskConfig)
def dataset_records(task: DatasetTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    """Train and validation records of ``task.path`` (and ``task.val_path``, or a seeded split);
    ``check(records, source)`` runs on each file's rows as read, so an error names the file's row."""
    rewards = [*task.rewards, *([task.correctness_reward] if task.correctness_reward else [])]
    train = read_records(task.path, "task.path", task.prompt_column)
    if check is not None:
        check(train, task.path)
    check_reward_columns(rewards, train, f"task.path={task.path!r}", task.reward_modules)
    if task.val_path:
        val = read_records(task.val_path, "task.val_path", task.prompt_column)
        if check is not None:
            check(val, task.val_path)
        check_reward_columns(rewards, val, f"task.val_path={task.val_path!r}", task.reward_modules)
        return train, val
    order = list(range(len(train)))
    random.Random(task.seed).shuffle(order)
    num_val = int(len(train) * task.val_fraction)
    return [train[i] for i in order[num_val:]], [train[i] for i in order[:num_val]]
