"""What every task shares: the split, the prompt check, and :func:`task_records`, the one call
that turns ``cfg.task`` into records through the registry (no branch on task names)."""

from __future__ import annotations

from collections.abc import Callable

from grpo_lightning.config.task import TASKS, TaskConfig

# check(records, source): vets prompts with the tokenizer (grpo_lightning.data.files.prompt_check).
Check = Callable[[list[dict], str], None]


def split(records: list[dict], val_fraction: float) -> tuple[list[dict], list[dict]]:
    """The first ``val_fraction`` of ``records`` held out, the rest for training."""
    num_val = int(len(records) * val_fraction)
    return records[num_val:], records[:num_val]


def checked(name: str, train: list[dict], val: list[dict], check: Check | None) -> tuple[list[dict], list[dict]]:
    """A generated task's records after ``check`` (there is no file row to name, so the task is named)."""
    if check is not None:
        check(train, f"task={name} (training prompts)")
        check(val, f"task={name} (held-out prompts)")
    return train, val


def task_records(task: TaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    """The registered task's (train, val) records; ``max_completion_chars`` and
    ``overlong_buffer_tokens`` are added for the generic length rewards.

    ``check(records, source)`` vets every prompt before any model loads; each task calls it where
    it can name the source best (task=dataset: the file, before the split)."""
    options = task.promoted()
    train, val = TASKS[options.name](options, check)
    if options.max_completion_chars:
        for record in train + val:
            record["max_completion_chars"] = options.max_completion_chars
    if options.overlong_buffer_tokens:  # the overlong_penalty reward's buffer (DAPO)
        for record in train + val:
            record["overlong_buffer_tokens"] = options.overlong_buffer_tokens
    return train, val
