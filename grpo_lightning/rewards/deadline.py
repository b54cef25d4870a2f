"""A reward function's time limit in the thread that calls it (``task.reward_timeout_s``).

Reward functions run where TRL runs them, in the calling thread, so one that uses signals (as
math-verify's own timeout does) keeps working. In the main thread a watchdog thread interrupts
a call that passes its limit: it sends ``SIGUSR2`` to the main thread, whose handler raises
:class:`RewardTimeout` (a ``BaseException``, so a broad ``except Exception`` in the function does
not swallow it), again every second until the call ends. A sleep or a blocking read ends at once;
code inside one long C call (a runaway regex) is interrupted when it returns to Python, and for
that ``task.reward_process=true`` runs the function in a process that is killed instead. Off the
main thread (no signal handlers there) the call runs in a daemon thread, abandoned at its limit.

The handler stays installed after a call (a signal sent just as a call ends must never meet the
default action, which ends the process); outside a call it does nothing but pass the signal on.
It is checked before every call and set again if someone replaced it: Lightning's fit restores
every signal's handler of before the fit when it ends, ours included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import signal
import threading
from typing import Any

from grpo_lightning.errors import RewardError

SIGNAL = getattr(signal, "SIGUSR2", None)
_state = threading.local()
_previous: Any = None
_install_lock = threading.Lock()


class RewardTimeout(BaseException):
    """Raised in a reward function that passed its limit (the watchdog's signal)."""


class RewardTimeLimitError(RewardError):
    """A reward function ran past ``task.reward_timeout_s``; the message names it and the limit."""


def _message(name: str, seconds: float, scored: int) -> str:
    return (
        f"reward function {name!r} ran past task.reward_timeout_s={seconds:g} s on a batch of {scored} "
        f"completions and was stopped; make it faster, or raise the limit (null: no limit)"
    )


class _Call:
    def __init__(self):
        self.fired = False
        self.done = False


def _on_signal(signum, frame) -> None:
    call = getattr(_state, "call", None)
    if call is not None and call.fired and not call.done:
        raise RewardTimeout
    if callable(_previous):  # not ours: whoever had the signal before
        _previous(signum, frame)


def _install() -> None:
    """Ours as the signal's handler (again, if someone replaced it); what it replaced is passed the signal."""
    global _previous
    with _install_lock:
        current = signal.getsignal(SIGNAL)
        if current is not _on_signal:
            _previous = current
            signal.signal(SIGNAL, _on_signal)


def call_with_limit(fn, seconds: float, name: str, scored: int, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` stopped after ``seconds`` with a :class:`RewardTimeLimitError`."""
    if threading.current_thread() is not threading.main_thread() or SIGNAL is None:
        return _in_daemon_thread(fn, seconds, name, scored, *args, **kwargs)
    _install()
    call = _Call()
    _state.call = call
    lock = threading.Lock()
    main = threading.main_thread().ident
    stopped = threading.Event()

    def watch() -> None:
        if stopped.wait(seconds):
            return
        while True:
            with lock:
                if call.done:
                    return
                call.fired = True
                signal.pthread_kill(main, SIGNAL)
            if stopped.wait(1.0):
                return

    threading.Thread(target=watch, name=f"reward-limit-{name}", daemon=True).start()
    try:
        try:
            return fn(*args, **kwargs)
        finally:  # the signal may land here too, just after the call returned: it still passed its limit
            with lock:
                call.done = True
            stopped.set()
            _state.call = None
    except RewardTimeout:
        raise RewardTimeLimitError(_message(name, seconds, scored)) from None


def _in_daemon_thread(fn, seconds: float, name: str, scored: int, *args: Any, **kwargs: Any) -> Any:
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001  (the caller decides what it means)
            future.set_exception(err)

    threading.Thread(target=work, name=f"reward-{name}", daemon=True).start()
    try:
        return future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise RewardTimeLimitError(_message(name, seconds, scored)) from None


class LimitedReward:
    """``fn`` under a time limit per call; an async ``fn``'s awaitable gets the same limit."""

    def __init__(self, name: str, fn, seconds: float):
        self.name, self.fn, self.seconds = name, fn, float(seconds)
        self.__wrapped__ = fn  # inspect.signature: the keyword arguments fn takes
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        scored = len(kwargs.get("completions") or (args[1] if len(args) > 1 else []) or [])
        value = call_with_limit(self.fn, self.seconds, self.name, scored, *args, **kwargs)
        if inspect.isawaitable(value):
            return self._bounded(value, scored)
        return value

    async def _bounded(self, awaitable, scored: int) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.seconds)
        except TimeoutError:
            raise RewardTimeLimitError(_message(self.name, self.seconds, scored)) from None
