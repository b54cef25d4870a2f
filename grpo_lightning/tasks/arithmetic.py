"""``task=arithmetic``, the built-in task: sums of small numbers, e.g. prompt "3+4=" with answer "7".

Generated in code (no download), split deterministically into train and validation; its
rewards give partial credit, so GRPO's signal is dense from the first step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.rewards.registry import register_reward
from grpo_lightning.tasks.base import Check, checked, split

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass
class ArithmeticTaskConfig(TaskConfig):
    name: str = task_name("arithmetic")
    max_operand: int = option(9, "Operands run from 0 to this value.")
    operators: str = option("+", "Operators to draw from, any of '+-*'.")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.max_operand >= 0, f"{p}max_operand={self.max_operand} must be >= 0")
        check(
            problems,
            bool(self.operators) and set(self.operators) <= set(OPERATORS),
            f"{p}operators={self.operators!r} must be one or more of {sorted(OPERATORS)}",
        )
        return problems


def arithmetic_records(
    max_operand: int = 9, operators: str = "+", val_fraction: float = 0.2, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """Every ``a <op> b`` with ``0 <= a, b <= max_operand``, shuffled, split train / val."""
    unknown = set(operators) - set(OPERATORS)
    if unknown:
        raise ValueError(f"task.operators may contain {sorted(OPERATORS)} only, got {sorted(unknown)}")
    records = [
        {"prompt": f"{a}{op}{b}=", "answer": str(OPERATORS[op](a, b))}
        for op in operators
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]
    random.Random(seed).shuffle(records)
    return split(records, val_fraction)


@TASKS.register("arithmetic", options=ArithmeticTaskConfig)
def arithmetic(options: ArithmeticTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    train, val = arithmetic_records(options.max_operand, options.operators, options.val_fraction, options.seed)
    return checked(options.name, train, val, check)


def _answer_text(completion: str) -> str:
    return completion.strip()


@register_reward("arithmetic_exact")
def arithmetic_exact(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 when the completion is exactly the answer (surrounding spaces ignored), else 0.0."""
    return [float(_answer_text(c) == str(a)) for c, a in zip(completions, answer, strict=True)]


@register_reward("arithmetic_digits")
def arithmetic_digits(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """Partial credit: right characters in the right places, over the longer of the two lengths.

    "7" for 7 scores 1, "7+" scores 0.5, "17" for 12 scores 0.5, "" scores 0.
    """
    scores = []
    for completion, target in zip(completions, answer, strict=True):
        guess, target = _answer_text(completion), str(target)
        # Position by position over the shorter text; the longer length below charges what is missing.
        matches = sum(g == t for g, t in zip(guess, target, strict=False))
        scores.append(matches / max(len(guess), len(target)))
    return scores


def _leading_int(text: str) -> int | None:
    """The integer a completion starts with ("12 apples" -> 12), or None."""
    text = text.strip()
    end = 1 if text[:1] == "-" else 0
    while end < len(text) and text[end].isdigit():
        end += 1
    try:
        return int(text[:end])
    except ValueError:
        return None


@register_reward("arithmetic_close")
def arithmetic_close(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """Partial credit for a numeric answer near the truth: ``max(0, 1 - |guess - answer| / 5)``.

    Only a completion that is just a number earns it ("7" for 8 scores 0.8, "7+" scores 0),
    so the signal points every prompt towards its own answer and towards the answer format.
    """
    scores = []
    for completion, target in zip(completions, answer, strict=True):
        text = completion.strip()
        guess = _leading_int(text)
        if guess is None or str(guess) != text:
            scores.append(0.0)
            continue
        scores.append(max(0.0, 1.0 - abs(guess - int(target)) / 5.0))
    return scores
