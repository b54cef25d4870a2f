"""What the HealthMonitor costs per training step on the default task (one CPU thread).

Baseline: the same run without the monitor. Two measurements, because shared machines are
noisy:

- direct share: time spent inside the monitor's hooks (it times itself) over the step time
  of the same run, both in wall time and in CPU time of the training thread (the CPU-time
  share is immune to other processes preempting this one); immune to drift between runs;
- A/B ratio: median step time with the monitor over the median without, from runs that
  alternate (with, without, with, ...) and start from the same seed, so they do the same work.

A step is timed from the first callback's ``on_train_batch_start`` to the last callback's
``on_train_batch_end``: rollout generation, the optimization step and the monitor.

    python benchmarks/health_overhead.py --steps 150 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import lightning as L
import torch

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig


class _StepStart(L.Callback):
    def __init__(self, clock: dict):
        self.clock = clock

    def on_train_batch_start(self, *args) -> None:
        self.clock["start"] = time.perf_counter()
        self.clock["cpu"] = time.thread_time()


class _StepEnd(L.Callback):
    def __init__(self, clock: dict):
        self.clock = clock
        self.times: list[float] = []
        self.cpu_times: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter() - self.clock["start"])
        self.cpu_times.append(time.thread_time() - self.clock["cpu"])


def timed_run(steps: int, monitor: bool, seed: int) -> dict:
    cfg = TrainConfig()
    cfg.trainer.max_steps = steps
    cfg.trainer.seed = seed
    cfg.logger.kind = "none"
    cfg.health.enabled = monitor
    run = build_run(cfg)
    clock: dict = {}
    end = _StepEnd(clock)
    trainer = run.trainer(cfg, callbacks=[_StepStart(clock), *run.callbacks, end], enable_progress_bar=False)
    trainer.fit(run.module, datamodule=run.datamodule)
    times = end.times[5:]  # drop warm-up steps
    out = {
        "median_step_s": statistics.median(times),
        "total_step_s": sum(end.times),
        "total_step_cpu_s": sum(end.cpu_times),
        "steps": len(end.times),
    }
    if monitor:
        out["monitor_s"] = run.health.seconds
        out["monitor_cpu_s"] = run.health.cpu_seconds
        out["alerts"] = len(run.health.alerts)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=str, default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    with_monitor, without = [], []
    for _ in range(args.repeats):
        with_monitor.append(timed_run(args.steps, True, args.seed))
        without.append(timed_run(args.steps, False, args.seed))
    direct = [r["monitor_s"] / r["total_step_s"] for r in with_monitor]
    direct_cpu = [r["monitor_cpu_s"] / r["total_step_cpu_s"] for r in with_monitor]
    ratios = [w["median_step_s"] / wo["median_step_s"] for w, wo in zip(with_monitor, without, strict=True)]
    result = {
        "steps": args.steps,
        "repeats": args.repeats,
        "monitor_ms_per_step": [1000 * r["monitor_s"] / r["steps"] for r in with_monitor],
        "step_ms_median_with": [1000 * r["median_step_s"] for r in with_monitor],
        "step_ms_median_without": [1000 * r["median_step_s"] for r in without],
        "direct_share": direct,
        "direct_share_cpu": direct_cpu,
        "monitor_cpu_ms_per_step": [1000 * r["monitor_cpu_s"] / r["steps"] for r in with_monitor],
        "step_cpu_ms_mean_with": [1000 * r["total_step_cpu_s"] / r["steps"] for r in with_monitor],
        "ab_ratio": ratios,
        "alerts": [r["alerts"] for r in with_monitor],
    }
    print(json.dumps(result, indent=1))
    print(
        f"monitor share of a step (direct, wall time): median {statistics.median(direct):.2%} "
        f"(runs: {', '.join(f'{d:.2%}' for d in direct)}); "
        f"(direct, CPU time): median {statistics.median(direct_cpu):.2%} "
        f"(runs: {', '.join(f'{d:.2%}' for d in direct_cpu)}); "
        f"A/B step-time ratio: median {statistics.median(ratios):.3f} "
        f"(runs: {', '.join(f'{r:.3f}' for r in ratios)})"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
