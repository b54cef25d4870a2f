"""The dataset columns each reward function needs, checked against the data before any model loads.

A reward function takes the record's other columns as keyword arguments; one that requires
``answer`` on data without that column would fail with a ``TypeError`` at the first scored
batch, after the model loaded and generated. Its required parameters say what it needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from grpo_lightning.errors import DataError
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS

# What the rollout passes besides the record's columns (grpo_lightning/rollout/generator.py).
PROVIDED = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "max_new_tokens"})


def required_columns(fn) -> list[str]:
    """The keyword parameters without a default that ``fn`` takes after ``prompts, completions``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [p.name for p in named[2:] if p.default is p.empty and p.name not in PROVIDED]


def check_reward_columns(rewards: Iterable[str], records: list[dict], source: str) -> None:
    """DataError naming the reward, the column it needs and the columns ``source`` has."""
    if not records:
        return
    columns = sorted({key for record in records for key in record})
    for name in rewards:
        fn = REWARD_FUNCTIONS.get(name)
        missing = [c for c in required_columns(fn) if c not in columns] if fn is not None else []
        if missing:
            raise DataError(
                f"reward {name!r} needs the column {missing[0]!r}, which {source} does not have (its columns: "
                f"{columns}); add the column, or choose rewards in task.rewards that use the columns it has"
            )
