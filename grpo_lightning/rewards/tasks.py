"""Rewards of the real tasks: correctness (reasoning-gym, GSM), answer format, length penalty.

Each is a registered reward function ``(prompts, completions, **record_fields)``; a task
names the ones it uses, with weights, in ``task.rewards`` (grpo_lightning/conf/task/*.yaml).
"""

from __future__ import annotations

import math

from grpo_lightning.rewards.answers import ANSWER_TAG, extract_answer, parse_number, tagged_answers
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


@register_reward("gsm_exact")
def gsm_exact(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 when the extracted number equals the reference (``"1,200"`` and ``"1200.0"`` match 1200)."""
    scores = []
    for completion, target in zip(completions, answer):
        guess, truth = parse_number(extract_answer(completion)), parse_number(str(target))
        scores.append(float(guess is not None and truth is not None and math.isclose(guess, truth, abs_tol=1e-6)))
    return scores


@register_reward("reasoning_gym")
def reasoning_gym_correct(prompts: list[str], completions: list[str], entry: list[dict], **_) -> list[float]:
    """The dataset's own ``score_answer(extracted answer, entry)`` (1.0 for correct, partial credit where it gives any)."""
    from grpo_lightning.data.reasoning_gym import score_answer

    return [score_answer(extract_answer(c), e) for c, e in zip(completions, entry)]


@register_reward("length_penalty")
def length_penalty(
    prompts: list[str], completions: list[str], max_completion_chars: list[int] | None = None, **_
) -> list[float]:
    """``-min(1, (len - limit) / limit)`` for a completion over the limit, else 0 (a limit of 0 is off).

    The limit comes from the record field ``max_completion_chars`` (task.max_completion_chars).
    """
    limits = max_completion_chars or [0] * len(completions)
    scores = []
    for completion, limit in zip(completions, limits):
        over = len(completion) - int(limit or 0)
        scores.append(-min(1.0, over / limit) if limit and over > 0 else 0.0)
    return scores
