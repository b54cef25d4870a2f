"""Where a step's peak RSS happens: one of ``memory.py``'s runs of ours, with a thread sampling
the resident set every few milliseconds and the step's phases marked (rollout, reference
pass, each micro-batch's forward and backward, optimizer step).

Prints, per phase, the RSS when it started, its highest sample and the RSS when it ended,
then the process's peak (``getrusage``, which the sampler may miss by a short spike).

    .venv-bench/bin/python benchmarks/memory_phases.py --model-dir ~/.cache/grpo_lightning/SmolLM2-135M-Instruct
    .venv-bench/bin/python benchmarks/memory_phases.py --run ours-full-fp32 --model-dir DIR
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import sys
import threading
import time
from contextlib import contextmanager
from functools import wraps
from pathlib import Path

import torch

from grpo_lightning.models.allocator import prefer_huge_pages

sys.path.insert(0, str(Path(__file__).parent))
from memory import RUNS, run_ours

PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_MB


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_mb() -> tuple[float, float, float]:
    """glibc's view: heap bytes in use, heap bytes free (slack), mmapped bytes; MB."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.uordblks / 2**20, info.fordblks / 2**20, info.hblkhd / 2**20


class Sampler(threading.Thread):
    """Samples RSS every ``interval`` seconds into the highs of the phases open at the time."""

    def __init__(self, interval: float = 0.001):
        super().__init__(daemon=True)
        self.interval, self.open, self.done = interval, [], False
        self.peak, self.peak_in = 0.0, ""

    def run(self) -> None:
        while not self.done:
            now = rss_mb()
            for row in list(self.open):
                row[2] = max(row[2], now)
            if now > self.peak:
                self.peak, self.peak_in = now, " > ".join(row[0] for row in self.open) or "outside the marked phases"
                self.peak_heap = heap_mb()
            time.sleep(self.interval)


ROWS: list[list] = []  # [name, start, high, end, CPU seconds]


@contextmanager
def phase(sampler: Sampler, name: str):
    start = rss_mb()
    row = [name, start, start, start, time.process_time()]
    sampler.open.append(row)
    try:
        yield
    finally:
        sampler.open.remove(row)
        row[3] = rss_mb()
        row[4] = time.process_time() - row[4]
        row[2] = max(row[2], row[3])
        ROWS.append(row)


TRIM = None  # ctypes malloc_trim when --trim


def mark(cls, method: str, sampler: Sampler, label: str | None = None) -> None:
    """Wrap ``cls.method`` (a class's method or a module's function) in a phase."""
    original = getattr(cls, method)

    @wraps(original)
    def marked(*args, **kwargs):
        if TRIM is not None:
            TRIM(0)
        with phase(sampler, label or method):
            return original(*args, **kwargs)

    setattr(cls, method, marked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--run", default="ours-lora16")
    parser.add_argument("--checkpointing", choices=["on", "off"], default="on")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before each marked phase (experiment)")
    args = parser.parse_args()
    if args.trim:
        global TRIM
        TRIM = ctypes.CDLL("libc.so.6").malloc_trim
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    prefer_huge_pages()  # before lightning's import allocates, as memory.py's runs of ours
    import lightning  # noqa: F401, PLC0415  (after the huge-pages choice: importing lightning allocates)

    import grpo_lightning.build  # noqa: PLC0415  (imports lightning: after the huge-pages choice)
    from grpo_lightning.step.module import GRPOModule  # noqa: PLC0415  (imports lightning: after the huge-pages choice)

    trainer, dtype, lora, beta = RUNS[args.run]
    assert trainer == "ours", "phases are marked in our module only"
    sampler = Sampler()
    sampler.start()
    print(f"after imports: {rss_mb():.0f} MB", flush=True)
    mark(grpo_lightning.build, "build_run", sampler, "build_run")
    mark(GRPOModule, "generate_rollout", sampler, "rollout")
    mark(GRPOModule, "_reference_log_probs", sampler, "reference pass")
    mark(GRPOModule, "completion_log_probs", sampler, "forward")
    mark(GRPOModule, "_backward", sampler, "backward")
    mark(GRPOModule, "_guarded_step", sampler, "optimizer step")
    mark(GRPOModule, "training_step", sampler, "whole step")
    run_ours(str(Path(args.model_dir).expanduser()), dtype, lora, beta, args.checkpointing == "on", args.steps)
    sampler.done = True
    print(f"{'phase':<18}{'start MB':>10}{'high MB':>10}{'end MB':>10}{'CPU s':>8}")
    for name, start, high, end, seconds in ROWS:
        print(f"{name:<18}{start:>10.0f}{high:>10.0f}{end:>10.0f}{seconds:>8.2f}")
    print(f"highest sample: {sampler.peak:.0f} MB in {sampler.peak_in}")
    print("glibc then: heap in use {:.0f} MB, heap free {:.0f} MB, mmapped {:.0f} MB".format(*sampler.peak_heap))
    print(f"peak RSS (getrusage): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
