"""Where large CPU tensors live (Linux): transparent huge pages by default, and optionally
freed blocks returned to the OS at once.

**Huge pages, on by default.** PyTorch backs CPU blocks of 2 MiB and more with transparent
huge pages when ``THP_MEM_ALLOC_ENABLE=1`` (its own switch: page-aligned blocks with
``madvise(MADV_HUGEPAGE)``). torch reads the switch once, at its first CPU allocation (importing
lightning makes one), so the choice (``trainer.huge_pages``) is applied explicitly at run start,
never on import: the CLI applies it (:func:`apply_huge_pages`) before it imports lightning, a
notebook or script calls :func:`prefer_huge_pages` before its imports, ``build_run`` applies it
again (too late only if something allocated first) and reports whether it took effect
(:func:`huge_pages_report`). The step's phases leave less resident slack in glibc's heap
this way, for a lower peak at the same step time; the effect is measured, not derived, and not
every program gains (benchmarks/results/LOG.md, "Huge pages and malloc's threshold").

**Freed memory back to the OS, opt-in.**

glibc serves blocks above its mmap threshold with ``mmap`` and hands them back on ``free``,
but it raises that threshold (up to 32 MiB) every time such a block is freed. After the first
step nearly every activation, gradient and logits buffer is therefore carved from the heap,
and memory freed by one phase (generation, reference forward, backward) stays resident while
the next phase grows the heap elsewhere: the process's peak RSS becomes the sum of the
phases' leftovers, not their maximum. ``mallopt(M_MMAP_THRESHOLD, n)`` fixes the threshold
(the same as starting Python with ``MALLOC_MMAP_THRESHOLD_=n``): blocks of ``n`` bytes and
more always come from ``mmap`` and go back to the OS when freed.

It is opt-in (``trainer.malloc_mmap_threshold``) because fresh memory costs page faults: a
lower peak for a slower step (the trade at several thresholds: benchmarks/results/LOG.md,
"Other measurements moved out of the code's docs").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

import torch

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
DEFAULT_THRESHOLD = 128 * 1024  # glibc's own starting threshold: 128 KiB
HUGE_PAGES_SWITCH = "THP_MEM_ALLOC_ENABLE"  # PyTorch's: huge pages for CPU blocks >= 2 MiB
KERNEL_HUGE_PAGES = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def prefer_huge_pages() -> None:
    """Ask torch for huge pages on large CPU blocks, unless the user already chose (``=0`` keeps
    them off). Effective only before torch's first CPU allocation (importing lightning makes one)."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault(HUGE_PAGES_SWITCH, "1")


def apply_huge_pages(enabled: bool) -> None:
    """``trainer.huge_pages``: :func:`prefer_huge_pages` when ``enabled``; otherwise torch's default
    (off) unless the user's own ``THP_MEM_ALLOC_ENABLE`` says otherwise."""
    if enabled:
        prefer_huge_pages()


def torch_uses_huge_pages() -> bool:
    """Whether torch's huge-page path is active in this process. It page-aligns every block of
    2 MiB and more; without it blocks are 64-byte aligned, so four page-aligned blocks in a row
    do not happen by chance."""
    blocks = [torch.empty((2 << 20) + 64 * i, dtype=torch.uint8) for i in range(4)]
    return all(block.data_ptr() % 4096 == 0 for block in blocks)


def _switch_on(value: str) -> bool:
    """As torch reads the switch (C ``atoi``): a leading integer other than 0 turns it on."""
    digits = value.strip()
    sign = digits[:1] if digits[:1] in "+-" else ""
    digits = digits[len(sign) :]
    number = digits[: len(digits) - len(digits.lstrip("0123456789"))]
    return bool(number) and int(number) != 0


def huge_pages_report(requested: bool = True) -> str | None:
    """One line for the run's log: are large CPU tensors on huge pages, and if not, why and what to
    do. ``requested``: ``trainer.huge_pages``."""
    if not sys.platform.startswith("linux"):
        return None
    switch = os.environ.get(HUGE_PAGES_SWITCH)
    try:
        kernel = KERNEL_HUGE_PAGES.read_text().strip()
    except OSError:
        kernel = "unknown"
    if torch_uses_huge_pages():
        if "[never]" in kernel:
            return (
                f"CPU tensors: torch asks for huge pages but the kernel has them off ({KERNEL_HUGE_PAGES}: {kernel}); "
                "peak memory is higher without them (README, Memory)"
            )
        return (
            f"CPU tensors of 2 MiB and more on transparent huge pages ({HUGE_PAGES_SWITCH}={switch}; kernel: {kernel})"
        )
    if switch is not None and not _switch_on(switch):
        return f"CPU tensors: huge pages off ({HUGE_PAGES_SWITCH}={switch})"
    if not requested:
        return "CPU tensors: huge pages off (trainer.huge_pages=false)"
    return (
        "CPU tensors: huge pages off because torch allocated memory before trainer.huge_pages was applied "
        f"(torch reads {HUGE_PAGES_SWITCH} once, at its first allocation): call "
        "grpo_lightning.models.allocator.prefer_huge_pages() before importing lightning or creating any tensor, "
        f"or start Python with {HUGE_PAGES_SWITCH}=1. Peak memory is higher without them (README, Memory)"
    )


def _libc_function(name: str, restype, argtypes):
    """glibc's function ``name`` with its signature set; None off Linux or where libc lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = restype, argtypes
    return function


def release_freed_memory(threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; False where there is
    no glibc (macOS, Windows, musl) and nothing changed."""
    mallopt = _libc_function("mallopt", ctypes.c_int, [ctypes.c_int, ctypes.c_int])
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))


TRIM_MIN_FREE_BYTES = 64 << 20  # less free heap than this is not worth malloc_trim's milliseconds


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+): ``fordblks`` is the free bytes the heap holds."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


_LIBC: dict = {}  # the loaded libc's malloc_trim and mallinfo2 (None where missing), once per process


def trim_heap(min_free_bytes: int = TRIM_MIN_FREE_BYTES) -> bool:
    """Hand glibc's free heap pages back to the OS (``malloc_trim(0)``) when the heap holds at
    least ``min_free_bytes`` free; True when it trimmed, False where there is no glibc or too
    little to give back.

    Called between a step's phases (after the rollout, after the optimizer step, before an
    export): the blocks one phase freed stay resident in the heap, and the next phase's
    differently sized (huge-page aligned) tensors often cannot reuse them, so without it the
    peak is the sum of the phases' leftovers. It changes no tensor. A trim walks the whole heap
    (about a millisecond) and memory touched again costs page faults, so a small model's step,
    whose heap holds a few MB free, skips it (reading the free bytes costs microseconds).
    """
    if not _LIBC:
        _LIBC["trim"] = _libc_function("malloc_trim", ctypes.c_int, [ctypes.c_size_t])
        _LIBC["info"] = _libc_function("mallinfo2", _MallInfo2, [])
    if _LIBC["trim"] is None:
        return False
    if _LIBC["info"] is not None and _LIBC["info"]().fordblks < min_free_bytes:
        return False
    _LIBC["trim"](0)
    return True
