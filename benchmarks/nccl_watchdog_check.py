"""GPU check: the sync watchdog ends a NCCL broadcast whose peer never joins (one GPU, torch only).

NCCL ignores the process group's timeout while it waits for a peer; the watchdog must still end
the call for the caller within ``timeout_s`` and abort the communicator. Loads
``grpo_lightning/rollout/sync_watchdog.py`` with a stub for its one import, so it runs where only
torch is installed: ``python benchmarks/nccl_watchdog_check.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import threading
import time
import types
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

WATCHDOG = Path(__file__).resolve().parents[1] / "grpo_lightning" / "rollout" / "sync_watchdog.py"


def load_watchdog() -> types.ModuleType:
    """``sync_watchdog.py`` on its own, its one import (``server_guard``) stubbed: no package needed."""
    stub = types.ModuleType("grpo_lightning.rollout.server_guard")
    stub.VLLMServerError = type("VLLMServerError", (RuntimeError,), {})
    sys.modules["grpo_lightning.rollout.server_guard"] = stub
    spec = importlib.util.spec_from_file_location("sync_watchdog", WATCHDOG)
    watchdog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(watchdog)
    return watchdog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout-s", type=float, default=3.0, help="the watchdog's limit on the broadcast")
    args = parser.parse_args()
    watchdog = load_watchdog()
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=600), wait_for_workers=False)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timedelta(seconds=600)  # what a stuck NCCL call would otherwise be left to
    group = dist.ProcessGroupNCCL(dist.PrefixStore("x", store), 0, 2, options)
    flat = torch.ones(1 << 20, device="cuda")
    broadcast = dist.BroadcastOptions()
    broadcast.rootRank = 0
    worker: list[threading.Thread] = []

    def push(_attempt):
        worker.append(threading.current_thread())
        group.broadcast([flat], broadcast).wait()
        torch.cuda.synchronize()

    attempt = watchdog.SyncAttempt("a NCCL push to a peer that never joins", args.timeout_s, abort=group.abort)
    start = time.perf_counter()
    try:
        attempt.run(push)
        print("FAIL: the broadcast returned")
    except watchdog.SyncTimeout as err:
        print(f"watchdog ended it after {time.perf_counter() - start:.2f} s: {err}")
    time.sleep(5)
    print(f"stuck thread still alive 5 s after the abort: {worker[0].is_alive() if worker else None}")
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {torch.cuda.get_device_name()}")
    sys.stdout.flush()
    os._exit(0)  # a thread left inside NCCL would otherwise hold the interpreter at exit


if __name__ == "__main__":
    main()
