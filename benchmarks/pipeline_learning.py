"""Does a pipelined run learn as fast per step as a synchronous one? Steps to reward 0.5 on the tiny
arithmetic task for ``rollout.mode=sync`` against ``rollout.mode=pipeline`` at ``max_lag`` 1, 2 and 4,
with and without a correction, over seeds, every run the CLI in a subprocess. Goal (issue 50): the
pipeline within 1.2x of sync's steps at ``max_lag <= 2``.

To fit a shared 2-core machine, every run starts from one **warm start** rather than from scratch:

1. **The warm start**, made once in ``--work`` and reused: the CLI's default run (the tiny recipe, sync,
   seed 0) for ``--warm-steps`` steps, exported (``hf/final``); its reward over its last ``--window``
   steps is recorded (about 0.3 at 300 steps; from scratch the recipe needs 575-639 steps to 0.5,
   docs/distillation.md).
2. **Each variant x seed**: ``model.name_or_path=<the warm start>`` (its weights only: a fresh optimizer,
   the recipe's lr), ``trainer.seed`` = the seed, at most ``--budget`` steps, and the variant's overrides
   (``VARIANTS``). A pipeline variant bounds the staleness at its lag (``max_off_policy_steps=max_lag``,
   the default ``off_policy_action=drop``); the correction is ``tis_token`` (docs/pipeline.md's advice at
   ``max_lag >= 2``; cap 2).

The reward each step is ``reward/mean`` from ``metrics.csv`` (0.5 ``arithmetic_exact`` + 0.5
``arithmetic_close``, the task's weights); steps to the threshold: the first step at which the mean of
the last ``--window`` steps is >= 0.5 (so at least ``--window`` steps). The script reads ``metrics.csv``
while a run goes on (the CSV logger writes it every 100 steps) and stops the run with SIGTERM (finish
the step, save, exit 143) once the crossing is in it; a run that does not cross runs its budget and is
"not reached". Up to ``--parallel`` runs at once, seed by seed (every variant of a seed before the
next seed). Each run's ``result.json`` is kept: a second call reuses it.

    python benchmarks/pipeline_learning.py --work /tmp/pipeline_learning --seeds 0 1 2 3 4 \\
        --out benchmarks/results/pipeline_learning.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_tiny import command_line, cpu_name, per_seed, read_steps, task_reward
from time_to_accuracy import first_crossing

THRESHOLD, WINDOW = 0.5, 50
CORRECTION = "tis_token"
POLL_SECONDS = 2.0  # how often a running run's metrics.csv is read


def pipeline(lag: int, corrected: bool = False) -> list[str]:
    out = ["rollout.mode=pipeline", f"rollout.pipeline.max_lag={lag}", f"rollout.max_off_policy_steps={lag}"]
    return [*out, f"algorithm.corrections=[{CORRECTION}]"] if corrected else out


VARIANTS = {  # name -> overrides on top of the warm start's recipe
    "sync": [],
    "lag1": pipeline(1),
    "lag2": pipeline(2),
    "lag4": pipeline(4),
    "lag2_tis": pipeline(2, corrected=True),
    "lag4_tis": pipeline(4, corrected=True),
}
PIPELINE_SUMS = ("pipeline/dropped_groups",)  # summed over the run's steps
PIPELINE_MEANS = (
    "pipeline/lag_mean",
    "pipeline/lag_max",
    "pipeline/multi_version_seqs",
    "pipeline/trainer_wait_fraction",
)


def start(overrides: list[str], output_dir: Path) -> tuple[subprocess.Popen, float]:
    """``grpo-lightning *overrides`` in a fresh process (its output in ``output_dir``); (process, start time)."""
    command = [sys.executable, "-m", "grpo_lightning.train", *overrides, f"trainer.output_dir={output_dir}"]
    command.append(f"hydra.run.dir={output_dir}/hydra")
    output_dir.mkdir(parents=True, exist_ok=True)
    log = open(output_dir / "train.log", "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), time.perf_counter()


def crossing(output_dir: Path, window: int) -> int | None:
    """The index of the step at which the last ``window`` rewards first average >= the threshold, if logged yet."""
    rewards = [task_reward(r) for r in read_steps(output_dir)]
    return first_crossing(rewards, THRESHOLD, window)


def summarize(rows: list[dict], window: int) -> dict:
    """Steps and training seconds to the threshold, the reward the run started and ended at, and its
    pipeline numbers (means over the steps up to the crossing or the end)."""
    rewards = [task_reward(r) for r in rows]
    index = first_crossing(rewards, THRESHOLD, window)
    upto = rows[: (len(rows) if index is None else index + 1)]
    times = [float(r.get("train/step_time") or 0.0) for r in upto]
    out = {
        "steps_run": len(rows),
        "steps_to_threshold": None if index is None else index + 1,
        "train_seconds_to_threshold": None if index is None else sum(times),
        "train_seconds_per_step_median": statistics.median(times) if times else None,
        "reward_first_window": sum(rewards[:window]) / len(rewards[:window]) if rewards else None,
        "reward_last_window": sum(rewards[-window:]) / len(rewards[-window:]) if rewards else None,
    }
    for name in (*PIPELINE_SUMS, *PIPELINE_MEANS):
        values = [float(r[name]) for r in upto if r.get(name)]
        if values:
            out[name] = sum(values) if name in PIPELINE_SUMS else sum(values) / len(values)
    return out


def make_warm_start(work: Path, steps: int, window: int) -> dict:
    """The default run for ``steps`` steps (sync, seed 0), exported; made once, its record reused after."""
    out = work / "warm_start"
    record = out / "warm_start.json"
    if record.is_file():
        return json.loads(record.read_text())
    overrides = [f"trainer.max_steps={steps}", "trainer.seed=0", "logger=csv", "eval.before_training=false"]
    before = os.getloadavg()
    process, began = start(overrides, out)
    code = process.wait()
    folder = out / "hf" / "final"
    if code != 0 or not (folder / "config.json").is_file():
        raise SystemExit(f"the warm-start run failed (exit {code}); see {out / 'train.log'}")
    rewards = [task_reward(r) for r in read_steps(out)]
    result = {
        "command": command_line(overrides),
        "folder": str(folder),
        "wall_seconds": time.perf_counter() - began,
        "load_average": [before, os.getloadavg()],
        "reward_last_window": sum(rewards[-window:]) / len(rewards[-window:]),
    }
    record.write_text(json.dumps(result, indent=2))
    return result


def run_all(work: Path, jobs: list[tuple[str, int]], warm: str, budget: int, window: int, parallel: int) -> list:
    """Every (variant, seed) run, ``parallel`` at a time, each stopped once it has crossed; their records."""
    results, pending, running = {}, list(jobs), {}
    while pending or running:
        while pending and len(running) < parallel:
            variant, seed = pending.pop(0)
            out = work / f"{variant}_seed{seed}"
            if (out / "result.json").is_file():
                results[variant, seed] = json.loads((out / "result.json").read_text())
                continue
            overrides = [f"model.name_or_path={warm}", *VARIANTS[variant], f"trainer.seed={seed}"]
            overrides += [f"trainer.max_steps={budget}", "logger=csv", "eval.before_training=false"]
            process, began = start(overrides, out)
            running[variant, seed] = (process, began, overrides, os.getloadavg(), False)
        time.sleep(POLL_SECONDS)
        for key, (process, began, overrides, load, stopped) in list(running.items()):
            out = work / f"{key[0]}_seed{key[1]}"
            if process.poll() is None:
                if not stopped and crossing(out, window) is not None:
                    process.send_signal(signal.SIGTERM)  # finish the step, save, exit 143
                    running[key] = (process, began, overrides, load, True)
                continue
            del running[key]
            result = {
                "variant": key[0],
                "seed": key[1],
                "command": command_line(overrides),
                "exit_code": process.returncode,
                "stopped_at_crossing": stopped,
                "wall_seconds": time.perf_counter() - began,
                "load_average": [load, os.getloadavg()],
                **summarize(read_steps(out), window),
            }
            (out / "result.json").write_text(json.dumps(result, indent=2))
            results[key] = result
            print(f"{key[0]} seed {key[1]}: {result['steps_to_threshold']} steps to {THRESHOLD}", flush=True)
    return [results[key] for key in jobs]


def table(runs: list[dict]) -> dict:
    """Per variant: the steps and seconds to the threshold, per seed and their median, and the median's
    ratio to sync's (a run that did not cross counts as the slowest)."""
    out = per_seed(runs, "variant", VARIANTS)
    for variant, summary in out.items():
        mine = [r for r in runs if r["variant"] == variant]
        summary["seeds"] = [r["seed"] for r in mine]
        summary["wall_seconds"] = [r["wall_seconds"] for r in mine]
    sync = out.get("sync", {}).get("median_steps")
    for summary in out.values():
        mine = summary["median_steps"]
        summary["steps_over_sync"] = mine / sync if sync and mine else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/pipeline_learning", help="runs and the warm start (reused when there)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--warm-steps", type=int, default=300, help="steps of the sync run every run starts from")
    parser.add_argument("--budget", type=int, default=600, help="most steps per run ('not reached' past it)")
    parser.add_argument("--window", type=int, default=WINDOW, help="steps the reward is averaged over")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    parser.add_argument("--out", help="the results' JSON (default: printed only)")
    args = parser.parse_args()
    work = Path(args.work)
    started = {"cpu": cpu_name(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    warm = make_warm_start(work, args.warm_steps, args.window)
    print(f"warm start: reward {warm['reward_last_window']:.3f} over its last {args.window} steps", flush=True)
    jobs = [(variant, seed) for seed in args.seeds for variant in args.variants]
    runs = run_all(work, jobs, warm["folder"], args.budget, args.window, args.parallel)
    settings = {"threshold": THRESHOLD, "window": args.window, "budget": args.budget, "warm_steps": args.warm_steps}
    results = {**started, **settings, "warm_start": warm, "summary": table(runs), "runs": runs}
    results["load_average_end"] = os.getloadavg()
    print(json.dumps(results["summary"], indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
