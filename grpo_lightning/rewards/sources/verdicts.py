"""Reading a judge's answer: a score, a pass/fail, or one of named choices; None when absent.

The last match counts (a judge that reasons first states its verdict at the end). Only the
judge's own words count: :func:`judge_words` drops from the answer the delimited completion
(a judge that echoes its input) and every line that is also a line of the completion (a judge
that quotes it), so a completion that writes "Score: 10" does not grade itself. A score outside
``[0, score_max]`` ("Score: 1e9", "Score: -3") is no verdict, not a clipped one.
"""

from __future__ import annotations

import re

NUMBER = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"  # the whole number: "1e9" is not a 1
VERDICTS = ("score", "pass_fail", "choice")
OUT_OF_RANGE = "out_of_range"


def judge_words(answer: str, completion: str, delimiters: tuple[str, str] | None = None) -> str:
    """The answer without the delimited completion and without the lines the completion contains."""
    if delimiters is not None:
        start, end = (re.escape(d) for d in delimiters)
        answer = re.sub(f"{start}.*?(?:{end}|$)", "\n", answer, flags=re.DOTALL)
    quoted = {line.strip() for line in completion.splitlines() if line.strip()}
    return "\n".join(line for line in answer.splitlines() if line.strip() not in quoted)


def last_number(text: str, pattern: str) -> float | None:
    """The number the last match of ``pattern`` captures (its first group), or None."""
    found = re.findall(pattern, text)
    if not found:
        return None
    value = found[-1] if isinstance(found[-1], str) else found[-1][0]
    try:
        return float(value)
    except ValueError:
        return None


def parse_score(text: str, pattern: str, scale: float) -> float | str | None:
    """The last score divided by ``scale``: in [0, 1], :data:`OUT_OF_RANGE`, or None when absent."""
    value = last_number(text, pattern)
    if value is None:
        return None
    return value / scale if 0.0 <= value <= scale else OUT_OF_RANGE


def parse_pass_fail(text: str) -> float | None:
    """1.0 for a final PASS, 0.0 for a final FAIL (whole words, any case)."""
    found = re.findall(r"\b(pass|fail)\b", text, flags=re.IGNORECASE)
    return None if not found else float(found[-1].lower() == "pass")


def parse_choice(text: str, choices: dict[str, float]) -> float | None:
    """The reward of the last choice named in ``text`` (whole words, case as given)."""
    alternatives = "|".join(re.escape(c) for c in sorted(choices, key=len, reverse=True))
    found = re.findall(rf"(?<!\w)({alternatives})(?!\w)", text)
    return None if not found else float(choices[found[-1]])
