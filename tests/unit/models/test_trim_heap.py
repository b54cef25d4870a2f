"""trim_heap: free heap pages in the middle of glibc's heap go back to the OS; nothing else changes."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

import pytest
from conftest import fit, make_config

import grpo_lightning.step.module as module
from grpo_lightning.models.allocator import trim_heap


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux-only")
def test_freed_blocks_below_a_live_one_go_back_to_the_os():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 << 10, 256  # 16 MiB in heap blocks (below glibc's mmap threshold)
    blocks = [libc.malloc(size) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, size)  # resident
    pin = libc.malloc(size)  # a live block above them: free() alone cannot shrink the heap's top
    for block in blocks:
        libc.free(block)
    before = rss_mb()
    assert not trim_heap(min_free_bytes=1 << 62)  # more free memory asked for than any heap holds: no trim
    assert rss_mb() > before - 4
    assert trim_heap(min_free_bytes=8 << 20)
    released = before - rss_mb()
    libc.free(pin)
    assert released > 8, f"only {released:.1f} MB of 16 freed went back to the OS"


def test_a_step_trims_the_heap_between_its_passes(monkeypatch):
    """Freed blocks go back to the OS after the reference pass, between each micro-batch's forward
    and backward, and after the optimizer step: on a LoRA step the heap held ~270 MB free when the
    backward began (benchmarks/results/LOG.md, "The LoRA peak after the in-place export")."""
    events = []
    monkeypatch.setattr(module, "trim_heap", lambda: events.append("trim"))
    for name in ("_reference_log_probs", "_backward"):
        real = getattr(module.GRPOModule, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            events.append(f"{_name} starts")
            out = _real(self, *args, **kwargs)
            events.append(f"{_name} ends")
            return out

        monkeypatch.setattr(module.GRPOModule, name, spy)
    fit(make_config(1, **{"algorithm.micro_batch_size": 32}))
    assert events.count("_reference_log_probs ends") == 1
    assert events[events.index("_reference_log_probs ends") + 1] == "trim"  # before the training forward
    backwards = [i for i, e in enumerate(events) if e == "_backward starts"]
    assert len(backwards) == 4  # 128 sequences in micro-batches of 32: a trim before each backward
    assert all(events[i - 1] == "trim" for i in backwards)
    assert events[-1] == "trim"  # after the optimizer step, before the next rollout
