"""How a reward function is called: TRL's keyword convention, and async functions on a loop of their own.

TRL's ``GRPOTrainer`` calls ``fn(prompts=..., completions=..., completion_ids=..., **columns,
trainer_state=..., log_extra=..., log_metric=...)``, all by keyword, so ``def accuracy(completions,
solution, **kwargs)`` works. We do the same, passing only the keywords a function takes unless it
has ``**kwargs``. A function whose first two parameters have other names (``lambda p, c, **_``,
the older convention of this package) gets the prompts and completions positionally instead.

Coroutines run on one event loop in a daemon thread, for the whole process (TRL does the same):
``asyncio.run`` fails when the caller already runs a loop (a notebook), and a loop that lives
across calls keeps clients an async reward caches (an HTTP session) usable at the next step.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# What the scorer passes besides the record's columns; a column with one of these names is refused.
PROVIDED = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "max_new_tokens"}
)


@dataclass(frozen=True)
class RewardState:
    """What reward functions get as ``trainer_state``, with the attribute names of TRL's TrainerState.

    ``epoch`` counts passes over the training prompts (fractional, as in TRL); ``max_steps`` is 0
    when the scorer runs outside a run with a fixed length."""

    global_step: int
    epoch: float = 0.0
    max_steps: int = 0


@dataclass(frozen=True)
class Signature:
    """What matters of a function's parameters for calling it."""

    names: frozenset[str]  # the parameters that can be passed by keyword
    takes_any: bool  # has **kwargs
    positional: bool  # first two parameters are not prompts/completions: pass those two positionally
    required: tuple[str, ...]  # keyword parameters without a default, after the positional pair if any


def signature_of(fn: Callable) -> Signature | None:
    """The parameters of ``fn``, or None when Python cannot tell (a builtin): then it gets every keyword."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    by_position = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    positional = len(by_position) >= 2 and not {"prompts", "completions"} & {p.name for p in params}
    skipped = {p.name for p in by_position[:2]} if positional else set()
    required = tuple(
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in skipped
    )
    return Signature(frozenset(named - skipped), any(p.kind is p.VAR_KEYWORD for p in params), positional, required)


def call_reward(fn: Callable, prompts: list, completions: list, kwargs: dict[str, Any]) -> Any:
    """``fn`` called as TRL calls it (see the module docstring); returns its value, or its coroutine."""
    sig = signature_of(fn)
    if sig is not None and sig.positional:
        rest = {k: v for k, v in kwargs.items() if sig.takes_any or k in sig.names}
        return fn(prompts, completions, **rest)
    everything = {"prompts": prompts, "completions": completions, **kwargs}
    if sig is None or sig.takes_any:
        return fn(**everything)
    return fn(**{k: v for k, v in everything.items() if k in sig.names})


# ----------------------------------------------------------------------------- async functions
_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The process's reward loop, started on first use in a daemon thread."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="grpo-reward-loop", daemon=True).start()
            _LOOP = loop
        return _LOOP


async def _kept(awaitable: Awaitable) -> Any:
    """The result, or the exception as a value: a SystemExit or KeyboardInterrupt raised in a task
    would otherwise leave the loop's thread and stop the loop for every later call."""
    try:
        return await awaitable
    except BaseException as err:  # noqa: BLE001  (returned to the caller, which names the function)
        return err


async def _all(awaitables: list[Awaitable]) -> list:
    return list(await asyncio.gather(*[_kept(a) for a in awaitables]))


def run_concurrently(awaitables: list[Awaitable]) -> list:
    """Await ``awaitables`` together on the reward loop; each result or exception, in order.

    Works whether or not the calling thread runs a loop of its own. Ctrl-C while waiting cancels them."""
    future = asyncio.run_coroutine_threadsafe(_all(awaitables), _loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
