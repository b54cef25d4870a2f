"""Rewards any task can use: answer format and length penalty (correctness lives with each task,
in ``grpo_lightning/tasks/<name>.py``).

Each is a registered reward function ``(prompts, completions, **record_fields)``; a task
names the ones it uses, with weights, in ``task.rewards`` (grpo_lightning/conf/task/*.yaml).
"""

from __future__ import annotations

from grpo_lightning.rewards.answers import ANSWER_TAG, tagged_answers
from grpo_lightning.rewards.registry import register_reward


@register_reward("answer_format")
def answer_format(prompts: list[str], completions: list[str], **_) -> list[float]:
    """1.0 for exactly one non-empty ``<answer>...</answer>`` tag with nothing after it, else 0.0."""
    scores = []
    for completion in completions:
        tags = tagged_answers(completion)
        closing = list(ANSWER_TAG.finditer(completion or ""))
        well_formed = len(tags) == 1 and tags[0] != "" and completion[closing[-1].end() :].strip() == ""
        scores.append(float(well_formed))
    return scores


@register_reward("length_penalty")
def length_penalty(
    prompts: list[str], completions: list[str], max_completion_chars: list[int] | None = None, **_
) -> list[float]:
    """``-min(1, (len - limit) / limit)`` for a completion over the limit, else 0 (a limit of 0 is off).

    The limit comes from the record field ``max_completion_chars`` (task.max_completion_chars).
    """
    limits = max_completion_chars or [0] * len(completions)
    scores = []
    for completion, limit in zip(completions, limits, strict=True):
        over = len(completion) - int(limit or 0)
        scores.append(-min(1.0, over / limit) if limit and over > 0 else 0.0)
    return scores
