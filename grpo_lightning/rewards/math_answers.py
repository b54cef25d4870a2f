"""Math answers compared with ``math-verify``, the checker TRL's and open-r1's accuracy rewards use.

``1,200`` = ``1200.0``, ``\\frac{1}{2}`` = ``0.5`` = ``1/2``, ``2\\sqrt{3}`` = ``\\sqrt{12}``,
``\\{1,2\\}`` = ``\\{2,1\\}``: equivalent forms count as equal, which comparing the last number
of the text cannot do. Two plain numbers are compared directly (most GSM answers: no parsing).

math-verify's own time limit uses ``SIGALRM``, which only works in the main thread (a reward
runs in a worker thread under async generation, a notebook's executor, ...). It is turned off
here and replaced by a deadline of our own: the check runs in a helper thread and a check past
:data:`DEADLINE_S` counts as "not equal", with one warning. A thread cannot be stopped, so the
stuck check finishes in the background and later checks use a fresh thread; a reward that must
be killable runs under ``task.reward_process=true`` (a worker process killed at ``task.reward_timeout_s``).
"""

from __future__ import annotations

import concurrent.futures
import math
import re
import threading
import warnings

DEADLINE_S = 5.0  # per comparison; sympy can take very long on a pathological expression
MAX_CHARS = 1000  # longer texts are no answer: compared as text, never parsed
_PLAIN_NUMBER = re.compile(r"\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)\s*\.?\s*")
_LATEX_HINT = re.compile(r"[\\^{}]")

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_warned = False


def _executor(fresh: bool = False) -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or fresh:
            if _pool is not None:
                _pool.shutdown(wait=False, cancel_futures=True)
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="math-verify")
        return _pool


def plain_number(text: str) -> float | None:
    """``text`` as a number when it is nothing else ("1,200", "$12", "-3.5."), else None."""
    match = _PLAIN_NUMBER.fullmatch(text)
    if match is None:
        return None
    try:
        return float(match.group(1).replace(",", ""))
    except ValueError:
        return None


def parse_math(text: str) -> list:
    """math-verify's parse of ``text``: LaTeX (with or without ``$``), plain expressions, ``\\boxed{}``."""
    import math_verify  # noqa: PLC0415  (sympy: at the first comparison, not while composing)
    import math_verify.grader  # noqa: PLC0415  (sympy: at the first comparison, not while composing)
    import math_verify.parser  # noqa: PLC0415  (sympy: at the first comparison, not while composing)

    # Its timeouts are off on purpose (ours is DEADLINE_S): silence its warning that they are.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    attempts = [f"${text}$", text] if "$" not in text and _LATEX_HINT.search(text) else [text, f"${text}$"]
    for attempt in attempts:
        parsed = math_verify.parse(attempt, parsing_timeout=None)
        if parsed:
            return parsed
    return []


def _verified(guess: str, truth: str) -> bool:
    import math_verify  # noqa: PLC0415  (sympy: at the first comparison, not while composing)

    gold, pred = parse_math(truth), parse_math(guess)
    if not gold or not pred:
        return _normalized(guess) == _normalized(truth)
    return bool(math_verify.verify(gold, pred, timeout_seconds=None))


def _normalized(text: str) -> str:
    return re.sub(r"\s+", "", text).strip("$.").lower()


def math_equal(guess: str | None, truth: str, deadline_s: float = DEADLINE_S) -> bool:
    """Whether the answer ``guess`` equals the reference ``truth`` as mathematics (None: no answer)."""
    global _warned
    if guess is None or truth is None:
        return False
    guess, truth = str(guess).strip(), str(truth).strip()
    a, b = plain_number(guess), plain_number(truth)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    if len(guess) > MAX_CHARS or len(truth) > MAX_CHARS:
        return _normalized(guess) == _normalized(truth)
    future = _executor().submit(_verified, guess, truth)
    try:
        return future.result(timeout=deadline_s)
    except concurrent.futures.TimeoutError:
        _executor(fresh=True)  # the stuck check keeps its thread; the next one gets another
        if not _warned:
            _warned = True
            warnings.warn(
                f"math-verify took over {deadline_s:g} s comparing {guess[:60]!r} with {truth[:60]!r}; such "
                "answers count as wrong (further ones without a warning)",
                stacklevel=2,
            )
        return False
    except Exception:  # noqa: BLE001  (sympy on the policy's text: an unparsable answer is a wrong one)
        return _normalized(guess) == _normalized(truth)
