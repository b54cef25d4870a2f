"""SIGINT / SIGTERM: the first finishes the step (a checkpoint, the model, exit 128 + signum); a
second stops at once, exit 128 + signum, without waiting for the step.

Each signal is acknowledged within milliseconds, whatever the main thread is doing. Python runs a
signal handler only when the main thread next runs Python code: inside a long C call (a forward
pass, a reward library) the first signal was acknowledged minutes late and a second one sent
before that was lost. So the handlers also route every signal through ``signal.set_wakeup_fd``: the
interpreter's C-level handler writes the signal number to a pipe at once, from whichever thread
the kernel picked, and a watcher thread reads it, counts it and says so. The stop itself is
unchanged: the training loop reads :attr:`StopSignals.received` at the step boundary; a second
signal raises :class:`StoppedAtOnce` in the main thread, and when the CLI owns the process
(``runtime/process_exit.py``) the process also exits within a second if the main thread cannot
get there (still blocked, or exit waiting for a thread stuck in user code).

With several ranks a signal may reach only some of them (``kill`` of one PID), so the stop is
decided at the step boundary by all ranks together (one all-reduce of the signal number): every
rank stops after the same step and none waits in a collective the others never join.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

import torch

from grpo_lightning.errors import StoppedAtOnce
from grpo_lightning.runtime import process_exit

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def say(message: str) -> None:
    print(f"[grpo_lightning] {message}", file=sys.stderr, flush=True)


class StopSignals:
    """The handlers and their watcher, installed for the training loop (main thread only) and restored after it."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._lock = threading.RLock()  # the handler may interrupt the main thread inside it
        self._from_pipe = 0  # stop signals read from the wakeup pipe
        self._from_handler = 0  # handler calls (fewer than signals when several came at once)
        self._said = 0  # signals acknowledged
        self._at_once: int | None = None  # the signal that asked to stop at once
        self._last = signal.SIGTERM  # the latest stop signal seen
        self._raised = False
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup = -1
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # not the main thread: leave signals alone
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._stop_watching.clear()
        self._watcher = threading.Thread(target=self._watch, name="grpo-stop-signals", daemon=True)
        self._watcher.start()

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._previous_wakeup)
        self._stop_watching.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=1.0)
        for fd in self._pipe:
            os.close(fd)
        self._pipe, self._watcher = None, None

    # ----------------------------------------------------------------------- counting
    def _watch(self) -> None:
        """The watcher thread: acknowledge each signal as soon as the pipe holds it."""
        pipe = self._pipe
        while pipe is not None and not self._stop_watching.is_set():
            try:
                ready, _, _ = select.select([pipe[0]], [], [], 0.2)
            except (OSError, ValueError):  # closed by restore
                return
            if ready:
                with self._lock:
                    self._drain()
                    self._acknowledge()

    def _drain(self) -> None:
        if self._pipe is None:
            return
        while True:
            try:
                data = os.read(self._pipe[0], 512)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._from_pipe += 1
                    self._last = signum

    def _acknowledge(self) -> None:
        """Say each signal not said yet. Counted as the larger of the pipe's count and the handler's:
        the pipe sees every signal, the handler is the fallback if another library took the wakeup fd."""
        count = max(self._from_pipe, self._from_handler)
        while self._said < count:
            self._said += 1
            signum = self._last
            name = signal.Signals(signum).name
            if self._said == 1:
                self.received = signum
                say(
                    f"got {name}: stopping after this step to write a checkpoint and the model "
                    "(send it again to stop at once)"
                )
            elif self._at_once is None:
                self._at_once = signum
                say(f"got {name} again: stopping now, without finishing the step (exit {128 + signum})")
                process_exit.exit_soon(128 + signum, process_exit.SECOND_SIGNAL_EXIT_S, f"stopped by a second {name}")

    def _on_signal(self, signum, frame) -> None:
        """The Python handler, in the main thread whenever it next runs Python code."""
        with self._lock:
            self._last = signum
            self._drain()
            self._from_handler += 1
            self._acknowledge()
            at_once = None if self._raised else self._at_once
            self._raised = self._raised or at_once is not None
        if at_once is not None:
            self.restore()
            raise StoppedAtOnce(128 + at_once)

    def agreed(self, trainer) -> int | None:
        """The signal that stops every rank after this step, or None to go on (call on every rank)."""
        if trainer.world_size <= 1:
            return self.received
        mine = torch.tensor(float(self.received or 0), device=trainer.strategy.root_device)
        signum = int(trainer.strategy.reduce(mine, reduce_op="max").item())
        return signum or None
