"""Does the tiny VLM learn ``task=shapes`` from scratch, per question type? (issue 48)

For each seed, ``grpo-lightning model=tiny_vlm task=shapes trainer.seed=S logger=csv
eval.every_n_steps=N`` in a fresh process (the task's defaults for the tiny VLM: one-token answers,
64 prompts a step, 600 steps, all 200 held-out questions), the seeds side by side, one thread each.
Then each run's ``metrics.csv`` gives the curves:

- held-out greedy accuracy per question type at every evaluation (``val/<type>/accuracy``: the task's
  ``group_column``) and over all types (``val/accuracy``);
- training accuracy per type (``reward/shapes_<type>``, sampled at temperature 1), the mean over each
  window of ``--window`` steps.

Chance per type: colour 1/4, shape 1/3, count 1/4, side 1/2 (the mix: 0.33). A finished run's
folder is read again, not trained again.

    python benchmarks/vision_shapes_learning.py --work /tmp/shapes --seeds 0 1 \\
        --out benchmarks/results/vision_shapes_learning.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_tiny import command_line, cpu_name, metric_rows
from pipeline_learning import start  # the CLI in a fresh process, its log in the run's folder

TYPES = ("color", "shape", "count", "side")
CHANCE = {"color": 1 / 4, "shape": 1 / 3, "count": 1 / 4, "side": 1 / 2}


def overrides(seed: int, every: int, extra: list[str]) -> list[str]:
    """The command line of one seed's run (the task's own defaults for the tiny VLM, plus ``extra``)."""
    return [
        "model=tiny_vlm",
        "task=shapes",
        f"trainer.seed={seed}",
        "logger=csv",
        f"eval.every_n_steps={every}",
        *extra,
    ]


def curves(rows: list[dict], window: int) -> dict:
    """Held-out accuracy per type at each evaluation, and training accuracy per type per window."""
    held_out = []
    for row in rows:
        if row.get("val/accuracy"):
            point = {"step": int(float(row["step"])), "all": float(row["val/accuracy"])}
            point.update({t: float(row[f"val/{t}/accuracy"]) for t in TYPES if row.get(f"val/{t}/accuracy")})
            held_out.append(point)
    steps = sorted((r for r in rows if r.get("reward/shapes_exact/mean")), key=lambda r: int(float(r["step"])))
    training = []
    for first in range(0, len(steps), window):
        chunk = steps[first : first + window]
        point = {"steps": f"{int(float(chunk[0]['step']))}-{int(float(chunk[-1]['step']))}"}
        for name in TYPES:
            values = [float(r[f"reward/shapes_{name}"]) for r in chunk if r.get(f"reward/shapes_{name}")]
            if values:
                point[name] = sum(values) / len(values)
        values = [float(r["reward/shapes_exact/mean"]) for r in chunk]
        point["all"] = sum(values) / len(values)
        training.append(point)
    seconds = [float(r["train/step_time"]) for r in steps if r.get("train/step_time")]
    return {"held_out": held_out, "training": training, "steps": len(steps), "train_seconds": sum(seconds)}


def table(results: dict[int, dict]) -> str:
    """Markdown: each seed's held-out accuracy per type at every evaluation, chance last."""
    lines = ["| seed | step | " + " | ".join(TYPES) + " | all |", "|---" * (len(TYPES) + 3) + "|"]
    for seed, result in sorted(results.items()):
        for point in result["held_out"]:
            cells = [f"{point[t]:.2f}" if t in point else "" for t in (*TYPES, "all")]
            lines.append(f"| {seed} | {point['step']} | " + " | ".join(cells) + " |")
    chance = sum(CHANCE.values()) / len(CHANCE)
    lines.append("| chance | | " + " | ".join(f"{CHANCE[t]:.2f}" for t in TYPES) + f" | {chance:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/vision_shapes_learning", help="the runs' folders (reused when there)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--every", type=int, default=100, help="steps between held-out evaluations")
    parser.add_argument("--window", type=int, default=100, help="steps the training accuracy is averaged over")
    parser.add_argument("--out", help="the results' JSON (default: printed only)")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # each run on one thread, the seeds side by side
    work, started = Path(args.work), {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
    runs = {}
    for seed in args.seeds:
        folder = work / f"seed_{seed}"
        line = overrides(seed, args.every, args.overrides)
        done = (folder / "hf" / "final" / "config.json").is_file()
        process = None if done else start(line, folder)[0]
        runs[seed] = (folder, line, process, time.perf_counter(), os.getloadavg())
    results = {}
    for seed, (folder, line, process, began, load) in runs.items():
        code = process.wait() if process is not None else 0
        if code != 0:
            raise SystemExit(f"seed {seed}: the run failed (exit {code}); see {folder / 'train.log'}")
        results[seed] = {
            "command": command_line(line),
            "wall_seconds": time.perf_counter() - began if process is not None else None,
            "load_average": [load, os.getloadavg()],
            **curves(metric_rows(folder), args.window),
        }
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps({**started, "chance": CHANCE, "seeds": results}, indent=2))


if __name__ == "__main__":
    main()
