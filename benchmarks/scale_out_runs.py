"""The issue's two 2-rank runs with a launched vLLM server, 10 steps each, through the CLI:

1. ``network``: merged weights over the network transport (no folder the server reads);
2. ``lora``: LoRA rank 8, adapter-only sync (automatic with model.lora.*), over the network too.

Both with ``verify_sync`` (the canary after every sync, before the version bump) and the CSV
logger; prints each run's exit status, wall time, syncs, largest canary difference, bytes per
sync and the reward of the first and last steps.

    python benchmarks/scale_out_runs.py [--steps 10]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMON = [
    "trainer.devices=2",
    "trainer.accelerator=cpu",
    "rollout=vllm",
    "rollout.vllm.server.launch=true",
    "rollout.vllm.max_model_len=128",
    "rollout.vllm.kv_cache_gib=0.5",
    "rollout.vllm.sync.transport=network",
    "rollout.vllm.verify_sync=true",
    "logger.kind=csv",
    "eval.before_training=false",
    "eval.num_prompts=8",
    "trainer.num_threads=1",
]
RUNS = {"network": [], "lora": ["model.lora.rank=8"]}


def column(rows: list[dict], name: str) -> list[float]:
    return [float(r[name]) for r in rows if r.get(name) not in (None, "")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    for name, extra in RUNS.items():
        out = Path(tempfile.mkdtemp(prefix=f"grpo-scale-out-{name}-"))
        command = [sys.executable, "-m", "grpo_lightning.train", *COMMON, *extra]
        command += [f"trainer.max_steps={args.steps}", f"trainer.output_dir={out}"]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - start
        print(f"{name}: exit {done.returncode} in {seconds:.0f} s ({out})")
        if done.returncode != 0:
            print(done.stderr[-2500:])
            continue
        (metrics,) = out.rglob("metrics.csv")
        rows = list(csv.DictReader(metrics.open()))
        diffs, sent = column(rows, "rollout/sync_probe_diff"), column(rows, "rollout/sync_bytes")
        rewards = column(rows, "reward/mean") or column(rows, "train/reward")
        print(
            f"  syncs logged {len(diffs)}, max canary diff {max(diffs):.2e}, bytes/sync {sent[-1] if sent else 0:.0f}, "
            f"reward first {rewards[0] if rewards else float('nan'):.3f} last {rewards[-1] if rewards else float('nan'):.3f}"
        )


if __name__ == "__main__":
    main()
