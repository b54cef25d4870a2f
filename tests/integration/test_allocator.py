"""Huge pages for large CPU tensors (trainer.huge_pages, applied before torch's first allocation), and
trainer.malloc_mmap_threshold: after glibc's mmap threshold has grown (a large block freed),
a freed tensor stays resident without the setting and goes back to the OS with it."""

from __future__ import annotations

import ctypes
import os
import random
import subprocess
import sys

import pytest
from conftest import make_config

from grpo_lightning import build
from grpo_lightning.models.allocator import KERNEL_HUGE_PAGES, _switch_on

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")

PROBE = r"""
import sys
from pathlib import Path
import torch
from grpo_lightning.models.allocator import release_freed_memory

def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

if sys.argv[1] == "on":
    assert release_freed_memory()
big = torch.ones(4 * 2**20)          # 16 MiB, mmapped; freeing it raises glibc's dynamic threshold to 16 MiB
del big
blocks = [torch.ones(2**19) for _ in range(8)]   # 8 x 2 MiB: heap blocks once the threshold grew
before = rss_mb()
del blocks
print(before - rss_mb())             # MiB handed back to the OS by the frees
"""


def returned_mb(setting: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, setting], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def test_freed_tensors_go_back_to_the_os_only_with_the_setting():
    on, off = returned_mb("on"), returned_mb("off")
    assert on > 14, on  # all 16 MiB (each 2 MiB block unmapped at once)
    assert off < 2, off  # the heap keeps them


def test_build_run_applies_the_setting(monkeypatch):
    calls = []
    monkeypatch.setattr(build, "release_freed_memory", lambda threshold: calls.append(threshold) or True)
    build.build_run(make_config(1))  # 0, the default: glibc's own threshold, nothing called
    cfg = make_config(1)
    cfg.trainer.malloc_mmap_threshold = 131072
    build.build_run(cfg)
    assert calls == [131072]


HUGE_PAGES_PROBE = r"""
import sys
import torch
if sys.argv[1] == "tensor-first":
    torch.ones(10)                  # torch reads THP_MEM_ALLOC_ENABLE at its first CPU allocation
from grpo_lightning.models.allocator import apply_huge_pages, huge_pages_report, torch_uses_huge_pages
apply_huge_pages(True)              # trainer.huge_pages=true, as the CLI applies it before lightning

big = torch.ones(2**21)             # 8 MiB, touched
huge_kb = sum(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages"))
print(torch_uses_huge_pages(), huge_kb, huge_pages_report(), sep="\n")
"""


def huge_pages_probe(order: str, **env: str) -> tuple[bool, int, str]:
    environment = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"} | env
    out = subprocess.run(
        [sys.executable, "-c", HUGE_PAGES_PROBE, order], capture_output=True, text=True, check=True, env=environment
    )
    active, huge_kb, report = out.stdout.strip().splitlines()[-3:]
    return active == "True", int(huge_kb), report


def kernel_mode() -> str:
    """always, madvise or never: the kernel's transparent huge pages setting (the bracketed word)."""
    return KERNEL_HUGE_PAGES.read_text().split("[")[1].split("]")[0]


def test_applying_the_choice_first_puts_large_cpu_tensors_on_huge_pages():
    active, huge_kb, report = huge_pages_probe("choice-first")
    assert active, report
    # the kernel honours the advice unless its huge pages are off altogether
    assert huge_kb >= 4096 or kernel_mode() == "never", huge_kb
    assert "on transparent huge pages" in report or "kernel has them off" in report, report


def test_a_tensor_before_the_choice_keeps_huge_pages_off_and_the_report_says_how_to_fix_it():
    active, huge_kb, report = huge_pages_probe("tensor-first")
    assert not active, report
    assert huge_kb == 0 or kernel_mode() == "always", huge_kb  # "always" gives huge pages to every large mapping
    assert "prefer_huge_pages() before importing lightning" in report and "THP_MEM_ALLOC_ENABLE=1" in report, report


def test_the_users_own_switch_wins():
    active, huge_kb, report = huge_pages_probe("choice-first", THP_MEM_ALLOC_ENABLE="0")
    assert not active, report
    assert huge_kb == 0 or kernel_mode() == "always", huge_kb
    assert report == "CPU tensors: huge pages off (THP_MEM_ALLOC_ENABLE=0)", report


def test_build_run_reports_huge_pages(monkeypatch):
    lines = []
    monkeypatch.setattr(build, "huge_pages_report", lambda requested: f"huge pages: the report ({requested})")
    monkeypatch.setattr(build, "rank_zero_info", lines.append)
    build.build_run(make_config(1))
    assert [line for line in lines if line.startswith("huge pages")] == ["huge pages: the report (True)"]


def test_the_switch_is_read_as_torch_reads_it():
    """torch turns huge pages on when C's atoi of THP_MEM_ALLOC_ENABLE is non-zero; the report
    must read "yes", " 2" or "0x1" the same way, or it blames the import order wrongly."""
    atoi = ctypes.CDLL("libc.so.6").atoi
    atoi.argtypes, atoi.restype = [ctypes.c_char_p], ctypes.c_int
    rng = random.Random(0)
    values = ["".join(rng.choice(" +-0123456789ax") for _ in range(rng.randint(0, 6))) for _ in range(3000)]
    for value in values + ["1", "0", "", "yes", "00", "-0", "+7"]:
        assert _switch_on(value) == (atoi(value.encode()) != 0), repr(value)


def test_importing_the_package_changes_no_allocator_setting():
    """No import side effects: not the env switch, and no lightning (whose import allocates, which
    would fix torch's allocator before the run could apply trainer.huge_pages)."""
    probe = (
        "import os, sys, grpo_lightning, grpo_lightning.train\n"
        "from grpo_lightning import TrainConfig\n"
        "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), 'lightning' in sys.modules)"
    )
    environment = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=environment)
    assert out.stdout.split() == ["None", "False"], out.stdout + out.stderr


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_applies_trainer_huge_pages(monkeypatch, enabled):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    cfg = make_config(1)
    cfg.trainer.huge_pages = enabled
    build.build_run(cfg)
    assert os.environ.get("THP_MEM_ALLOC_ENABLE") == ("1" if enabled else None)
