"""Reading a judge's answer: a score, a pass/fail, or one of named choices; None when absent.

The last match counts (a judge that reasons first states its verdict at the end).
"""

from __future__ import annotations

import re

NUMBER = r"(-?\d+(?:\.\d+)?)"
VERDICTS = ("score", "pass_fail", "choice")


def parse_score(text: str, pattern: str, scale: float) -> float | None:
    """The number ``pattern`` captures (its last match), divided by ``scale`` and clipped to [0, 1]."""
    found = re.findall(pattern, text)
    if not found:
        return None
    value = found[-1] if isinstance(found[-1], str) else found[-1][0]
    return min(max(float(value) / scale, 0.0), 1.0)


def parse_pass_fail(text: str) -> float | None:
    """1.0 for a final PASS, 0.0 for a final FAIL (whole words, any case)."""
    found = re.findall(r"\b(pass|fail)\b", text, flags=re.IGNORECASE)
    return None if not found else float(found[-1].lower() == "pass")


def parse_choice(text: str, choices: dict[str, float]) -> float | None:
    """The reward of the last choice named in ``text`` (whole words, case as given)."""
    alternatives = "|".join(re.escape(c) for c in sorted(choices, key=len, reverse=True))
    found = re.findall(rf"(?<!\w)({alternatives})(?!\w)", text)
    return None if not found else float(choices[found[-1]])
