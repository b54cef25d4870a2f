"""trainer.malloc_mmap_threshold: after glibc's mmap threshold has grown (a large block freed),
a freed tensor stays resident without the setting and goes back to the OS with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
    assert on > 14, on      # all 16 MiB (each 2 MiB block unmapped at once)
    assert off < 2, off     # the heap keeps them


def test_build_run_applies_the_setting(monkeypatch):
    from grpo_lightning import build
    from conftest import make_config

    calls = []
    monkeypatch.setattr(build, "release_freed_memory", lambda threshold: calls.append(threshold) or True)
    build.build_run(make_config(1))  # 0, the default: glibc's own threshold, nothing called
    cfg = make_config(1)
    cfg.trainer.malloc_mmap_threshold = 131072
    build.build_run(cfg)
    assert calls == [131072]
