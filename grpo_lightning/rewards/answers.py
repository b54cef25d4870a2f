"""Reading the answer out of a completion: the ``<answer>...</answer>`` tag, ``\\boxed{}``, or the last number.

Why lenient: a small instruction-tuned model often states the right number without the tag
at first. Correctness rewards read the tag when there is one and otherwise the last number
of the text, so the policy gets credit for being right from step one; the separate
``answer_format`` reward is what teaches the tag.
"""

from __future__ import annotations

import re

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def tagged_answers(completion: str) -> list[str]:
    """Contents of every ``<answer>...</answer>`` tag, stripped."""
    return [m.strip() for m in ANSWER_TAG.findall(completion or "")]


def last_number(text: str) -> str | None:
    """The last number written in ``text`` ("so it is 1,234." -> "1,234"), or None."""
    found = NUMBER.findall(text or "")
    return found[-1] if found else None


def boxed_answers(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (braces inside balanced), stripped."""
    found, start = [], 0
    while (at := (text or "").find("\\boxed{", start)) >= 0:
        depth, i = 1, at + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            break  # unclosed: no answer
        found.append(text[at + len("\\boxed{") : i - 1].strip())
        start = i
    return found


def extract_answer(completion: str) -> str | None:
    """The last tagged answer if any tag is present, else the last ``\\boxed{}``, else the last number, else None."""
    tagged = tagged_answers(completion) or boxed_answers(completion)
    if tagged:
        return tagged[-1]
    return last_number(completion)


def parse_number(text: str | None) -> float | None:
    """A numeric answer as a float ("$1,200.00" -> 1200.0, "12 apples" -> 12.0); None when there is none."""
    if text is None:
        return None
    number = last_number(text.replace("$", ""))
    if number is None:
        return None
    try:
        return float(number.replace(",", ""))
    except ValueError:
        return None
