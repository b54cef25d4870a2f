"""On-policy distillation on the tiny arithmetic task: how many steps, and how much time, a fresh student
needs to reach reward 0.5 (the mean of its last 50 steps) by GRPO alone, by pure distillation, and by
distillation beside the reward. Goal: distillation in at most a third of GRPO's steps.

1. **The teacher**, made once in ``--work`` and reused: the tiny model trained by GRPO with the CLI's
   default run (``trainer.max_steps=--teacher-steps``), exported (``hf/final``). Its reward over its
   last 50 training steps must be at least 0.8 (said, and recorded).
2. **Each method x seed**: a fresh student (``model.tiny.init_seed=1``: the same architecture, not the
   teacher's starting weights), the CLI in a subprocess (``grpo-lightning ...``, the command recorded),
   ``trainer.seed`` = the seed, a fixed budget of steps. ``grpo``: the recipe as it is (lr 3e-4);
   ``grpo_lr1e-3``: at the distillation runs' lr. Every distillation run: ``algorithm.beta=0`` (the teacher
   replaces the reference, as verl advises), ``algorithm.lr=1e-3`` (a dense, low-variance signal takes a
   larger step; at 3e-4 the JSD needed about twice the steps). ``distill``: the JSD (beta 0.5), every
   reward weight 0 (the rewards are still computed and logged); ``distill_reward``: the same beside the
   default rewards; ``distill_sampled``: pure distillation by the sampled-token reverse KL.

The reward each step is read from ``metrics.csv`` the same way for every method: 0.5 x
``reward/arithmetic_exact/mean`` + 0.5 x ``reward/arithmetic_close/mean`` (the task's default weights, so
for GRPO it is ``reward/mean``). Steps to the threshold: the first step at which the mean of the last 50
is >= 0.5; time: the sum of ``train/step_time`` up to it (rollout and update, the training itself) and
the run's whole wall time beside it. Every run is resumable: a finished run's ``result.json`` is kept.

    python benchmarks/distill_tiny.py --work /tmp/distill_tiny --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_to_accuracy import first_crossing

THRESHOLD, WINDOW = 0.5, 50
TEACHER_MIN_REWARD = 0.8
WEIGHTS = {"arithmetic_exact": 0.5, "arithmetic_close": 0.5}  # the task's defaults (conf/task/arithmetic.yaml)
STUDENT = ["model.tiny.init_seed=1"]
PURE = [f"task.rewards.{name}=0" for name in WEIGHTS]
TEACHER = ["algorithm.teacher.path={teacher}", "algorithm.beta=0", "algorithm.lr=1e-3"]
JSD = ["algorithm.teacher.objective=jsd"]  # beta 0.5, the default
METHODS = {  # name -> (overrides, default budget in steps)
    "grpo": ([], 1000),  # the tiny recipe as it is (lr 3e-4)
    "grpo_lr1e-3": (["algorithm.lr=1e-3"], 1000),  # GRPO at the distillation runs' lr
    "distill": ([*TEACHER, *JSD, *PURE], 400),  # pure distillation, full distributions
    "distill_reward": ([*TEACHER, *JSD], 400),  # the same beside the default rewards
    "distill_sampled": ([*TEACHER, *PURE], 400),  # pure distillation, the sampled-token reverse KL
}


def cpu_name() -> str:
    """The CPU as ``lscpu`` names it (model name, family, model)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    get = {k.strip(): v.strip() for k, v in fields.items()}.get
    return f"{get('Model name', '?')}, family {get('CPU family', '?')} model {get('Model', '?')}, {get('CPU(s)', '?')} CPUs"


def cli(overrides: list[str], output_dir: Path, log: Path) -> tuple[int, float, tuple, tuple]:
    """``grpo-lightning *overrides`` in a fresh process, its output in ``output_dir``; (exit code, wall seconds,
    load average before, after)."""
    command = [sys.executable, "-m", "grpo_lightning.train", *overrides, f"trainer.output_dir={output_dir}"]
    command.append(f"hydra.run.dir={output_dir}/hydra")
    before, start = os.getloadavg(), time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    return code, time.perf_counter() - start, before, os.getloadavg()


def command_line(overrides: list[str]) -> str:
    return "grpo-lightning " + " ".join(f"'{o}'" if " " in o else o for o in overrides)


def metric_rows(output_dir: Path) -> list[dict]:
    """The rows of a run's latest ``metrics.csv``, in order (none before the run has logged)."""
    files = sorted(output_dir.glob("csv/version_*/metrics.csv"))
    return list(csv.DictReader(open(files[-1]))) if files else []


def read_steps(output_dir: Path) -> list[dict]:
    """Each training step's row of ``metrics.csv`` that has the reward (in step order)."""
    rows = [r for r in metric_rows(output_dir) if r.get(f"reward/{next(iter(WEIGHTS))}/mean")]
    return sorted(rows, key=lambda r: int(r["step"]))


def task_reward(row: dict) -> float:
    return sum(w * float(row[f"reward/{name}/mean"]) for name, w in WEIGHTS.items())


def summarize(rows: list[dict], window: int = WINDOW, threshold: float = THRESHOLD) -> dict:
    """Steps and training seconds to the threshold, and what the run ended at."""
    rewards = [task_reward(r) for r in rows]
    times = [float(r.get("train/step_time") or 0.0) for r in rows]
    index = first_crossing(rewards, threshold, window) if len(rewards) >= window else None
    last = rewards[-window:]
    out = {
        "steps_run": len(rows),
        "steps_to_threshold": None if index is None else index + 1,
        "train_seconds_to_threshold": None if index is None else sum(times[: index + 1]),
        "train_seconds_per_step_median": statistics.median(times) if times else None,
        "reward_last_window": sum(last) / len(last) if last else None,
    }
    kl = [float(r["distill/kl"]) for r in rows if r.get("distill/kl")]
    if kl:
        out["distill_kl_first_last"] = [kl[0], kl[-1]]
    return out


def make_teacher(work: Path, steps: int) -> dict:
    """GRPO-train the teacher once (the CLI's default run, seed 0) and export it; its record is reused after
    (a finished run in ``work/teacher`` without one is read, not trained again)."""
    record = work / "teacher" / "teacher.json"
    if record.is_file():
        return json.loads(record.read_text())
    overrides = [f"trainer.max_steps={steps}", "logger=csv"]
    out = work / "teacher"
    out.mkdir(parents=True, exist_ok=True)
    if (out / "hf" / "final" / "config.json").is_file() and read_steps(out):
        code, seconds, before, after = 0, None, None, None
    else:
        code, seconds, before, after = cli(overrides, out, out / "train.log")
    summary = summarize(read_steps(out))
    result = {
        "command": command_line(overrides),
        "exit_code": code,
        "folder": str(out / "hf" / "final"),
        "wall_seconds": seconds,
        "load_average": [before, after],
        **summary,
    }
    if code != 0 or not (out / "hf" / "final" / "config.json").is_file():
        raise SystemExit(f"the teacher run failed (exit {code}); see {out / 'train.log'}")
    if summary["reward_last_window"] < TEACHER_MIN_REWARD:
        print(
            f"warning: the teacher's reward over its last {WINDOW} steps is {summary['reward_last_window']:.3f} < 0.8"
        )
    record.write_text(json.dumps(result, indent=2))
    return result


def run(work: Path, method: str, seed: int, teacher: str, budget: int, window: int) -> dict:
    out = work / f"{method}_seed{seed}"
    record = out / "result.json"
    if record.is_file():
        return json.loads(record.read_text())
    extra, _ = METHODS[method]
    overrides = [*STUDENT, *(o.format(teacher=teacher) for o in extra)]
    overrides += [f"trainer.seed={seed}", f"trainer.max_steps={budget}", "logger=csv", "eval.before_training=false"]
    out.mkdir(parents=True, exist_ok=True)
    code, seconds, before, after = cli(overrides, out, out / "train.log")
    result = {
        "method": method,
        "seed": seed,
        "command": command_line(overrides),
        "exit_code": code,
        "wall_seconds": seconds,
        "load_average": [before, after],
        **summarize(read_steps(out), window),
    }
    record.write_text(json.dumps(result, indent=2))
    print(
        f"{method} seed {seed}: {result['steps_to_threshold']} steps to {THRESHOLD} ({seconds:.0f} s run)", flush=True
    )
    return result


def median_or_none(values: list) -> float | None:
    """The median with a run that never got there (None) counted as the slowest; None when the median is one."""
    ranked = [math.inf if v is None else v for v in values]
    middle = statistics.median(ranked) if ranked else math.inf
    return None if math.isinf(middle) else middle


def per_seed(runs: list[dict], key: str, names) -> dict:
    """Per ``run[key]`` in ``names``: the steps and training seconds to the threshold, per seed and their
    median, and the reward each run ended at."""
    out = {}
    for name in names:
        mine = [r for r in runs if r[key] == name]
        if not mine:
            continue
        steps = [r["steps_to_threshold"] for r in mine]
        seconds = [r["train_seconds_to_threshold"] for r in mine]
        out[name] = {
            "steps": steps,
            "median_steps": median_or_none(steps),
            "train_seconds": seconds,
            "median_train_seconds": median_or_none(seconds),
            "reward_last_window": [r["reward_last_window"] for r in mine],
        }
    return out


def table(runs: list[dict]) -> dict:
    """Per method: the steps and training seconds to the threshold, per seed and their median."""
    out = per_seed(runs, "method", METHODS)
    grpo = out.get("grpo", {}).get("median_steps")
    for method in [m for m in METHODS if m.startswith("distill")]:
        if method in out:
            mine = out[method]["median_steps"]
            out[method]["grpo_steps_over_these"] = grpo / mine if grpo and mine else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/distill_tiny", help="runs and the teacher (reused when there)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=list(METHODS))
    parser.add_argument("--teacher-steps", type=int, default=3000)
    parser.add_argument("--budget", type=int, help="steps per run (default: each method's own)")
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--out", help="the results' JSON (default: printed only)")
    args = parser.parse_args()
    work = Path(args.work)
    started = {"cpu": cpu_name(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    teacher = make_teacher(work, args.teacher_steps)
    print(f"teacher: reward {teacher['reward_last_window']:.3f} over its last {WINDOW} steps", flush=True)
    runs = [
        run(work, method, seed, teacher["folder"], args.budget or METHODS[method][1], args.window)
        for seed in args.seeds
        for method in args.methods
    ]
    results = {**started, "teacher": teacher, "summary": table(runs), "runs": runs, "load_average_end": os.getloadavg()}
    print(json.dumps(results["summary"], indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
