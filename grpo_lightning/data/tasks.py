"""``task.name`` -> train and validation records, plus the fields every record of the task carries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo_lightning.data.arithmetic import arithmetic_records

if TYPE_CHECKING:
    from grpo_lightning.config import TaskConfig


def task_records(task: TaskConfig, check=None) -> tuple[list[dict], list[dict]]:
    """Build the task's records; ``max_completion_chars`` is added for the length penalty.

    ``check(records, source)`` (task=dataset) vets each file's rows before the split, so an
    error can name the file's row."""
    if task.name == "arithmetic":
        train, val = arithmetic_records(task.max_operand, task.operators, task.val_fraction, task.seed)
    elif task.name == "reasoning_gym":
        from grpo_lightning.data.reasoning_gym import reasoning_gym_records

        train, val = reasoning_gym_records(task.dataset, task.size, task.seed, task.val_fraction, task.dataset_options)
    elif task.name == "gsm":
        from grpo_lightning.data.gsm import gsm_records

        train, val = gsm_records(task.size, task.seed, task.val_fraction)
    elif task.name == "dataset":
        from grpo_lightning.data.files import dataset_records

        train, val = dataset_records(task, check)
    else:
        raise ValueError(f"task.name={task.name!r}: no such task")
    if task.max_completion_chars:
        for record in train + val:
            record["max_completion_chars"] = task.max_completion_chars
    if task.overlong_buffer_tokens:  # the overlong_penalty reward's buffer (DAPO)
        for record in train + val:
            record["overlong_buffer_tokens"] = task.overlong_buffer_tokens
    return train, val
