"""Keep an engine's start-up from changing the trainer process's global state.

vLLM's in-process CPU worker reseeds the global RNGs (torch, numpy, ``random``) to its own
seed and replaces ``torch.set_num_threads`` with a no-op. A trainer that started the engine
after seeding would then draw different dropout masks / data orders than without the
engine, and could no longer set its thread count. :func:`preserved_process_state` snapshots
what the trainer owns and puts it back when the block ends.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class ProcessState:
    """The global state a training loop relies on; compared with :meth:`same_as` in tests."""

    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor]
    numpy_rng: Any
    python_rng: Any
    num_threads: int
    affinity: frozenset[int] | None  # the calling thread's CPU affinity (Linux), None elsewhere

    @classmethod
    def capture(cls) -> ProcessState:
        return cls(
            torch_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            numpy_rng=np.random.get_state(),
            python_rng=random.getstate(),
            num_threads=torch.get_num_threads(),
            affinity=frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        )

    def same_as(self, other: ProcessState) -> bool:
        """True when RNG streams and thread count are identical (numpy compared field by field)."""
        return (
            torch.equal(self.torch_rng, other.torch_rng)
            and len(self.cuda_rng) == len(other.cuda_rng)
            and all(torch.equal(a, b) for a, b in zip(self.cuda_rng, other.cuda_rng, strict=True))
            and self.numpy_rng[0] == other.numpy_rng[0]
            and np.array_equal(self.numpy_rng[1], other.numpy_rng[1])
            and self.numpy_rng[2:] == other.numpy_rng[2:]
            and self.python_rng == other.python_rng
            and self.num_threads == other.num_threads
            and self.affinity == other.affinity
        )

    def restore(self) -> None:
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        np.random.set_state(self.numpy_rng)
        random.setstate(self.python_rng)
        torch.set_num_threads(self.num_threads)
        if self.affinity is not None and frozenset(os.sched_getaffinity(0)) != self.affinity:
            os.sched_setaffinity(0, self.affinity)


def _set_num_threads_except_in(original, engine_thread: int):
    """``torch.set_num_threads`` for every thread but the engine's, where it stays a no-op.

    vLLM's CPU worker binds its OpenMP threads when it starts and builds attention metadata
    for that thread count; a later ``set_num_threads`` in the engine thread breaks its kernels
    (``metadata->thread_num == thread_num``). The trainer's threads keep the real function.
    """

    def set_num_threads(num: int) -> None:
        if threading.get_ident() != engine_thread:
            original(num)

    set_num_threads.__wrapped__ = original
    set_num_threads.__doc__ = original.__doc__
    return set_num_threads


@contextmanager
def preserved_process_state(engine_thread: int | None = None) -> Iterator[ProcessState]:
    """Run a block (an engine start) and undo its changes to RNGs and torch's thread count.

    If the block replaced ``torch.set_num_threads``, the trainer gets the real function back:
    with ``engine_thread`` (the id of the thread the engine runs in) calls from that thread
    alone are ignored, otherwise the original is restored outright.
    """
    state = ProcessState.capture()
    original_set_num_threads = torch.set_num_threads
    try:
        yield state
    finally:
        if torch.set_num_threads is not original_set_num_threads:
            torch.set_num_threads = (
                original_set_num_threads
                if engine_thread is None
                else _set_num_threads_except_in(original_set_num_threads, engine_thread)
            )
        state.restore()
