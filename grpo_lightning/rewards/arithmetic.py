"""Rewards of the built-in arithmetic task; partial credit makes GRPO's signal dense."""

from __future__ import annotations

from grpo_lightning.rewards.registry import register_reward


def _answer_text(completion: str) -> str:
    return completion.strip()


@register_reward("arithmetic_exact")
def arithmetic_exact(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 when the completion is exactly the answer (surrounding spaces ignored), else 0.0."""
    return [float(_answer_text(c) == str(a)) for c, a in zip(completions, answer)]


@register_reward("arithmetic_digits")
def arithmetic_digits(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """Partial credit: right characters in the right places, over the longer of the two lengths.

    "7" for 7 scores 1, "7+" scores 0.5, "17" for 12 scores 0.5, "" scores 0.
    """
    scores = []
    for completion, target in zip(completions, answer):
        guess, target = _answer_text(completion), str(target)
        matches = sum(g == t for g, t in zip(guess, target))
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
    for completion, target in zip(completions, answer):
        text = completion.strip()
        guess = _leading_int(text)
        if guess is None or str(guess) != text:
            scores.append(0.0)
            continue
        scores.append(max(0.0, 1.0 - abs(guess - int(target)) / 5.0))
    return scores
