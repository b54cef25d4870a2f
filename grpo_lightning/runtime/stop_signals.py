"""SIGINT / SIGTERM: the first finishes the step (a checkpoint, the model, exit 128 + signum); a
second stops at once, exit 128 + signum, without waiting for the step.

With several ranks a signal may reach only some of them (``kill`` of one PID), so the stop is
decided at the step boundary by all ranks together (one all-reduce of the signal number): every
rank stops after the same step and none waits in a collective the others never join.
"""

from __future__ import annotations

import signal
import sys

import torch

from grpo_lightning.errors import StoppedAtOnce

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def say(message: str) -> None:
    print(f"[grpo_lightning] {message}", file=sys.stderr, flush=True)


class StopSignals:
    """The handlers, installed for the training loop (main thread only) and restored after it."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        try:
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        except ValueError:  # not the main thread: leave signals alone
            self._previous.clear()

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            self.restore()
            say(f"got {name} again: stopping now, without finishing the step (exit {128 + signum})")
            raise StoppedAtOnce(128 + signum)
        self.received = signum
        say(f"got {name}: stopping after this step to write a checkpoint and the model (send it again to stop at once)")

    def agreed(self, trainer) -> int | None:
        """The signal that stops every rank after this step, or None to go on (call on every rank)."""
        if trainer.world_size <= 1:
            return self.received
        mine = torch.tensor(float(self.received or 0), device=trainer.strategy.root_device)
        signum = int(trainer.strategy.reduce(mine, reduce_op="max").item())
        return signum or None
