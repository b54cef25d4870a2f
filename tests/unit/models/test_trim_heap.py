"""trim_heap: free heap pages in the middle of glibc's heap go back to the OS; nothing else changes."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

import pytest

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
