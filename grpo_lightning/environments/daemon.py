"""User code (an environment's reset/step/close, a tool) called in a daemon thread of its own.

Python cannot stop a thread, so a call past its time limit is abandoned, and it must never be one
that interpreter exit waits for: a ``ThreadPoolExecutor``'s workers are joined at exit (and
``asyncio.to_thread`` uses one), so a single hung call kept a finished run, or one stopped by
SIGTERM, from ever exiting. A daemon thread is left behind when the process ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any


def in_daemon_thread(fn: Callable[..., Any], *args: Any, name: str = "user-call") -> concurrent.futures.Future:
    """Start ``fn(*args)`` in a new daemon thread; its future holds the result or whatever it raised."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work() -> None:
        if not future.set_running_or_notify_cancel():  # running: a timeout can no longer cancel it
            return
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001  (the caller decides what each exception means)
            future.set_exception(err)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def awaited_in_daemon_thread(fn: Callable[..., Any], *args: Any, name: str = "user-call") -> asyncio.Future:
    """:func:`in_daemon_thread` as a future of the running loop. A future, not a coroutine: awaited by the
    caller, a ``SystemExit`` the call raised reaches the caller's ``except``; a coroutine wrapped in a task
    (``asyncio.wait_for`` does so) would re-raise it out of the event loop."""
    return asyncio.wrap_future(in_daemon_thread(fn, *args, name=name))
