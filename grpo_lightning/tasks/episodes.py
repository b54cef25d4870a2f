"""``task=episodes``: an environment of your own (``task.environment``) played on the rows of a file.

The environment is registered by name in a ``plugins=[my_env.py]`` file
(``@ENVIRONMENTS.register("mine")`` on a factory ``(options, row) -> environment``); the rows come
from any file ``task=dataset`` reads (``task.path``, ``task.val_path`` or a ``task.val_fraction``
split), each one handed to ``reset(seed, row)`` as it is: no column is required. The limits,
the reward aggregator and the rewards are the options every episode task has; the held-out rows
play every ``eval.every_n_steps`` (``val/*``, docs/environments.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, task_name
from grpo_lightning.data.files import read_records
from grpo_lightning.environments.limits import EpisodeTaskConfig
from grpo_lightning.rewards.columns import check_reward_columns
from grpo_lightning.tasks.base import Check


@dataclass
class EpisodesTaskConfig(EpisodeTaskConfig):
    name: str = task_name("episodes")
    environment: str = option(
        "", "The environment: a name registered with @ENVIRONMENTS.register in a plugins=[file.py] (required)."
    )
    rewards: dict[str, float] = option(
        {"environment": 1.0}, "Reward function name -> weight (environment: the environment's own)."
    )
    # Hydra's structured configs take Optional, not "str | None".
    path: Optional[str] = option(  # noqa: UP045
        None, "The rows, each handed to reset: a .jsonl/.json/.parquet/.csv file or a datasets.save_to_disk folder."
    )
    val_path: Optional[str] = option(None, "Held-out rows like task.path; null splits task.val_fraction off it.")  # noqa: UP045
    env_args: dict[str, Any] = option({}, "Options for your environment's factory, read as options.env_args.")

    def check_fields(self, p: str) -> list[str]:
        if not self.environment:  # before the registry's message about the name '' (which says less)
            return [
                "task=episodes needs task.environment=NAME: an environment registered with "
                "@ENVIRONMENTS.register('NAME') in a file given as plugins=[my_env.py] (docs/environments.md)"
            ]
        problems = super().check_fields(p)
        check(
            problems,
            bool(self.path),
            "task=episodes needs task.path=PATH: the rows handed to reset, a .jsonl, .json, .parquet or .csv file "
            "or a datasets.save_to_disk folder",
        )
        return problems


@TASKS.register("episodes", options=EpisodesTaskConfig)
def episode_rows(task: EpisodesTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    """Train and held-out rows of ``task.path`` (and ``task.val_path``, or a seeded split). The rows are
    the environment's to read, so ``check`` (which vets a ``prompt`` column) does not apply: the
    environment's first messages are checked against the tokenizer at start-up instead."""
    train = read_records(task.path, "task.path", None)
    check_reward_columns(list(task.rewards), train, f"task.path={task.path!r}", task.reward_modules)
    if task.val_path:
        return train, read_records(task.val_path, "task.val_path", None)
    order = list(range(len(train)))
    random.Random(task.seed).shuffle(order)
    num_val = int(len(train) * task.val_fraction)
    return [train[i] for i in order[num_val:]], [train[i] for i in order[:num_val]]
