"""Stop an out-of-process vLLM engine's processes when the trainer dies, even by SIGKILL.

vLLM spawns its EngineCore (and the EngineCore its worker) with multiprocessing; neither
watches the trainer, so a trainer killed with SIGKILL left both running, holding the model
and its KV cache. :func:`watch` starts a small standard-library process that blocks reading a
pipe only the trainer writes to: the kernel closes that pipe when the trainer dies, however it
dies, and the watchdog then stops the processes it was given (SIGTERM, then SIGKILL after a
grace period). :meth:`Watchdog.release` tells it the engine was shut down normally.
"""

from __future__ import annotations

import subprocess
import sys

import psutil

GRACE_S = 5.0

_WATCHDOG = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the trainer's to handle
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grace, pids = float(sys.argv[1]), [int(p) for p in sys.argv[2:]]
if sys.stdin.buffer.read(1):  # released: the engine was shut down by the trainer
    sys.exit(0)
def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
"""


def descendants() -> set[int]:
    """Process ids of every living descendant of this process."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


class Watchdog:
    """The watchdog process of :func:`watch`; :meth:`release` it once the processes were stopped."""

    def __init__(self, pids: list[int], grace_s: float = GRACE_S):
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(grace_s), *map(str, pids)],
            stdin=subprocess.PIPE,
            close_fds=True,
        )

    def release(self) -> None:
        """The processes were stopped by their owner: the watchdog exits without signalling them."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.write(b"x")
                self.process.stdin.close()
            except BrokenPipeError:  # the watchdog is gone already
                pass
        self.process.wait()


def watch(new_pids: set[int], grace_s: float = GRACE_S) -> Watchdog | None:
    """A watchdog over ``new_pids`` (e.g. :func:`descendants` after a start less those before), or
    None when there are none."""
    return Watchdog(sorted(new_pids), grace_s) if new_pids else None
