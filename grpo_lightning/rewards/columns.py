"""The dataset columns each reward function needs, checked against the data before any model loads.

A reward function takes the record's other columns as keyword arguments; one that requires
``answer`` on data without that column would fail with a ``TypeError`` at the first scored
batch, after the model loaded and generated. Its required parameters say what it needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from grpo_lightning.errors import DataError, UserError
from grpo_lightning.rewards.calling import PROVIDED, signature_of
from grpo_lightning.rewards.lookup import find_reward


def repeat_columns(records: list[dict], group_size: int) -> dict[str, list]:
    """Every column but ``prompt``, one value per completion: each record's value ``group_size``
    times, record after record (the completions' order). A record without a column gives None."""
    keys = list(dict.fromkeys(key for record in records for key in record if key != "prompt"))
    return {key: [record.get(key) for record in records for _ in range(group_size)] for key in keys}


def required_columns(fn) -> list[str]:
    """The parameters without a default that ``fn`` needs from the data (not those the scorer passes)."""
    sig = signature_of(fn)
    return [] if sig is None else [name for name in sig.required if name not in PROVIDED]


def check_reward_columns(rewards: Iterable[str], records: list[dict], source: str, modules: Sequence[str] = ()) -> None:
    """DataError naming the reward, the column it needs and the columns ``source`` has."""
    if not records:
        return
    columns = sorted({key for record in records for key in record})
    for name in rewards:
        try:
            fn = find_reward(name, modules)
        except UserError:  # reported by the config check
            continue
        missing = [c for c in required_columns(fn) if c not in columns]
        if missing:
            raise DataError(
                f"reward {name!r} needs the column {missing[0]!r}, which {source} does not have (its columns: "
                f"{columns}); add the column, or choose rewards in task.rewards that use the columns it has"
            )
