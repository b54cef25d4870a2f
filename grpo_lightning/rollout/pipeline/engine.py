"""What an engine must do to serve the pipeline (:class:`StreamingEngine`), and its busy/idle clock.

A pipeline engine takes groups of requests at any time (``submit``) and calls back when a group's
last sample ends; new weights (``load_weights``) reach it at its next safe point, between decode
steps, without dropping or restarting the sequences in flight: their later tokens are sampled
with the new weights. Every completion it returns carries the version of each token
(``Completion.token_weight_versions``: the weights whose forward pass gave that token's
distribution, so a sequence may span several) and the log-prob it was sampled with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from grpo_lightning.records import Completion
from grpo_lightning.rollout.engine import GenerationRequest, RolloutEngine, Sampling

Finished = Callable[[list[Completion]], None]  # a group's completions, in request order
Failed = Callable[[BaseException], None]


@runtime_checkable
class StreamingEngine(RolloutEngine, Protocol):
    """A :class:`RolloutEngine` (``generate`` serves the held-out evaluation) that also streams."""

    streams: bool  # True: serves rollout.mode=pipeline

    def submit(self, requests: list[GenerationRequest], sampling: Sampling, done: Finished, failed: Failed) -> None:
        """Start generating ``requests`` (one group); ``done`` gets their completions once every one ended."""
        ...

    def clock(self) -> ClockReading:
        """The engine's busy, idle and sync seconds so far (``load_weights``: new weights at the next safe
        point, returning once they are in use)."""
        ...

    def cancel(self) -> None:
        """Drop the groups submitted and not finished (the end of training): their callbacks never come."""
        ...


@dataclass
class ClockReading:
    busy: float = 0.0  # generating (prefill, decode, sampling)
    idle: float = 0.0  # nothing to generate
    sync: float = 0.0  # taking new weights (paused)

    def minus(self, other: ClockReading) -> ClockReading:
        return ClockReading(self.busy - other.busy, self.idle - other.idle, self.sync - other.sync)

    @property
    def total(self) -> float:
        return self.busy + self.idle + self.sync


class EngineClock:
    """Sorts an engine thread's wall time into busy, idle and sync, continuously: ``read()`` includes
    the time since the last switch, so readings add up to the wall clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = ClockReading()
        self._state = "idle"
        self._since = time.perf_counter()

    def switch(self, state: str) -> None:
        """From now on the engine is ``state`` (busy, idle or sync)."""
        with self._lock:
            now = time.perf_counter()
            setattr(self._totals, self._state, getattr(self._totals, self._state) + now - self._since)
            self._state, self._since = state, now

    def read(self) -> ClockReading:
        with self._lock:
            totals = ClockReading(self._totals.busy, self._totals.idle, self._totals.sync)
            setattr(totals, self._state, getattr(totals, self._state) + time.perf_counter() - self._since)
            return totals
