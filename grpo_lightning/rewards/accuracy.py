"""``math_accuracy``: TRL-style accuracy against the data's ``solution`` (or ``answer``) column.

The reward TRL users know as ``accuracy_reward``: the completion's answer (the ``<answer>`` tag,
``\\boxed{}``, else the last number) compared with the reference by math-verify
(:mod:`.math_answers`). The reference is the ``solution`` column when the data has one (its
``\\boxed{}`` or ``#### N`` line when it is a worked solution), else ``answer``. A row without a
reference returns None: the reward does not apply to it (TRL's rule).
"""

from __future__ import annotations

import re

from grpo_lightning.rewards.answers import boxed_answers, extract_answer
from grpo_lightning.rewards.math_answers import math_equal
from grpo_lightning.rewards.registry import register_reward

_FINAL_LINE = re.compile(r"####\s*(.+?)\s*$", re.MULTILINE)


def reference_answer(solution) -> str | None:
    """The final answer of a reference: its last ``\\boxed{}``, a GSM ``#### N`` line, else the whole text."""
    if solution is None or (isinstance(solution, float) and solution != solution):  # None, or a NaN cell
        return None
    text = str(solution).strip()
    boxed = boxed_answers(text)
    if boxed:
        return boxed[-1]
    final = _FINAL_LINE.findall(text)
    return final[-1] if final else (text or None)


def completion_text(completion) -> str:
    """A completion's text: the string, or the content of the last message (conversational data)."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1].get("content", "")) if completion else ""


@register_reward("math_accuracy")
def math_accuracy(completions: list, solution: list | None = None, answer: list | None = None, **_) -> list:
    """1.0 when the completion's answer equals the reference as mathematics, 0.0 when not, None without a reference."""
    references = solution if solution is not None else answer
    if references is None:
        raise ValueError("math_accuracy needs a 'solution' or 'answer' column in the data")
    scores: list[float | None] = []
    for completion, reference in zip(completions, references, strict=True):
        truth = reference_answer(reference)
        scores.append(None if truth is None else float(math_equal(extract_answer(completion_text(completion)), truth)))
    return scores
