"""The CLI's process ends, whatever user code left running: the run's promise of "never silently".

Two things could keep it alive after the run was over. Interpreter exit joins every non-daemon
thread (and every ``ThreadPoolExecutor`` worker): one stuck in user code (an environment, a tool,
a reward, a library they call) hung a finished run forever. And a second SIGTERM raises in the
main thread only when it next runs Python: one blocked in a long C call, or exiting while it
joins such a thread, never got there.

Only when the CLI is the process's program (:func:`own_process`; a notebook or a test calling
``train.cli()`` keeps its process): at interpreter shutdown, if non-daemon threads are still
alive after :data:`STUCK_AT_EXIT_S`, the process says which (their name and where they are) and
exits with the run's own exit code; after a second stop signal it exits within
:data:`SECOND_SIGNAL_EXIT_S`, finished unwinding or not (:func:`exit_soon`).
"""

from __future__ import annotations

import os
import sys
import threading
import time

STUCK_AT_EXIT_S = 5.0  # a finished run's shutdown joins idle workers in milliseconds; stuck ones never
SECOND_SIGNAL_EXIT_S = 1.0  # time to unwind after a second SIGINT/SIGTERM before the process just ends

_owned = False
_exit_code = 0
_shutting_down = threading.Event()


def say(message: str) -> None:
    print(f"[grpo_lightning] {message}", file=sys.stderr, flush=True)


def own_process() -> None:
    """The CLI is this process's program: arm the exit guard (once)."""
    global _owned
    if _owned:
        return
    _owned = True
    register = getattr(threading, "_register_atexit", None)  # runs before non-daemon threads are joined
    if register is not None:
        # Started now: a thread cannot always be started once the interpreter is shutting down.
        _daemon(_guard_exit, "grpo-exit-guard")
        register(_shutting_down.set)


def owns_process() -> bool:
    return _owned


def set_exit_code(code: object) -> None:
    """The code the process is about to exit with (``SystemExit.code``), for an exit the guard forces."""
    global _exit_code
    _exit_code = code if isinstance(code, int) else (0 if code is None else 1)


def exit_soon(code: int, seconds: float, why: str) -> None:
    """Exit with ``code`` in ``seconds`` unless the process has ended by then (only when owned)."""
    if not _owned:
        return

    def later() -> None:
        time.sleep(seconds)
        main = threading.main_thread()
        where = _where(main) if main.is_alive() else "shutting down"
        _exit_now(code, f"{why}; the main thread was still busy ({where}) after {seconds:g} s: exiting now")

    _daemon(later, "grpo-exit-soon")


def stuck_threads() -> list[threading.Thread]:
    """Live non-daemon threads other than the main one: what interpreter exit would wait for."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not main]


def _guard_exit() -> None:
    _shutting_down.wait()
    deadline = time.monotonic() + STUCK_AT_EXIT_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if not stuck_threads():
            return  # nothing left that exit waits for
    stuck = stuck_threads()
    if stuck:
        threads = "; ".join(f"{t.name!r} ({_where(t)})" for t in stuck[:5])
        _exit_now(
            _exit_code,
            f"the run has ended but {len(stuck)} thread(s) still run (user code: an environment, a tool, a reward, a library) and would keep the process alive: "
            f"{threads}; exiting without them",
        )


def _where(thread: threading.Thread) -> str:
    """``file:line in function`` of the innermost frame ``thread`` is running."""
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return "no Python frame"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _exit_now(code: int, message: str) -> None:
    say(f"{message} (exit {code})")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110  (a closed stream must not keep the process alive)
            pass
    os._exit(code)


def _daemon(target, name: str) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()
