"""Context distillation on SmolLM2-135M-Instruct: the student learns to answer without a few-shot prompt
as the same model answers with it.

The teacher is SmolLM2 itself, frozen at its start, shown a system prompt with worked examples
(``algorithm.teacher.kind=context``, ``algorithm.teacher.context.system_prompt``); the student is the same
model without them (the task's own system prompt). Pure distillation (every reward weight 0: the rewards
are only logged), ``algorithm.beta=0``, the recipe of ``+preset=smollm2_reasoning_gym`` otherwise (4
prompts x 8 samples x 16 tokens, lr 2e-5, cosine), a reasoning-gym dataset. Measured, from the CLI:

- the teacher's own held-out accuracy: ``grpo-lightning-eval`` of SmolLM2 with the few-shot system prompt;
- the student's held-out accuracy before (``eval.before_training``) and after ``--steps`` steps (greedy, the
  first ``--eval-prompts`` validation problems), per seed, and the median seconds per training step.

    python benchmarks/distill_context_smollm2.py --work /tmp/distill_ctx --seeds 0 1 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from grpo_lightning.models.smollm2 import ensure_smollm2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_tiny import cli, command_line, cpu_name, metric_rows

TASK = ["+preset=smollm2_reasoning_gym", "task.dataset=products", "+task.dataset_options.max_digits=1"]
PURE = ["task.rewards.reasoning_gym=0", "task.rewards.answer_format=0", "task.rewards.length_penalty=0"]
BASE_SYSTEM = "Reply with only the final answer inside <answer></answer> tags."  # the preset's
# Worked examples the student never sees, written by hand. The first 3 lift SmolLM2's held-out accuracy
# on 1-digit products from 0.45 to 0.69 (64 problems; docs/distillation.md); all 6 gave 0.31 in an
# exploratory evaluation whose output was not kept.
SHOTS = [("7 * 2", "14"), ("3 * 6", "18"), ("9 * 8", "72"), ("4 * 5", "20"), ("6 * 7", "42"), ("8 * 3", "24")]


def few_shot_prompt(shots: int) -> str:
    examples = "\n".join(
        f"Q: Solve the following multiplication: {q}. Give only the result as your final answer.\nA: <answer>{a}</answer>"
        for q, a in SHOTS[:shots]
    )
    return f"{BASE_SYSTEM}\nExamples:\n{examples}"


def quoted(key: str, text: str) -> str:
    """A Hydra override of a string that holds spaces, colons and newlines."""
    return f"{key}='{text}'"


def teacher_accuracy(work: Path, system: str, prompts: int) -> dict:
    """``grpo-lightning-eval`` of SmolLM2 shown the teacher's prompt: the teacher's own held-out accuracy."""
    record = work / "teacher_eval.json"
    if record.is_file():
        return json.loads(record.read_text())
    overrides = [f"eval.checkpoint={ensure_smollm2()}", *TASK, f"eval.num_prompts={prompts}"]
    overrides.append(quoted("task.system_prompt", system))
    command = [sys.executable, "-m", "grpo_lightning.eval_cli", *overrides, f"hydra.run.dir={work}/teacher_eval"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the teacher's evaluation failed: {done.stderr[-2000:]}")
    rows = [line for line in done.stdout.splitlines() if line.strip().startswith("all")]
    accuracy = float(re.split(r"\s+", rows[-1].strip())[2]) if rows else None  # source, prompts, accuracy
    result = {
        "command": "grpo-lightning-eval " + " ".join(overrides),
        "accuracy": accuracy,
        "printed": done.stdout[-1500:],
        "seconds": time.perf_counter() - start,
    }
    record.write_text(json.dumps(result, indent=2))
    return result


def val_accuracy(rows: list[dict]) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r["val/accuracy"])) for r in rows if r.get("val/accuracy")]


def training_rows(rows: list[dict]) -> list[dict]:
    """The training steps' rows (those with a step time), in step order. Not the tiny benchmark's
    reader: every reward weight is 0 here and the task's reward columns are reasoning-gym's."""
    return sorted((r for r in rows if r.get("train/step_time")), key=lambda r: int(r["step"]))


def column(rows: list[dict], name: str) -> list[float]:
    return [float(r[name]) for r in rows if r.get(name)]


def summarize_student(rows: list[dict], steps: int) -> dict:
    """What a student run's metrics say: held-out accuracy by step, seconds per step, the teacher
    pass's share of them, and the distillation metrics at the first and last step."""
    accuracy, train = val_accuracy(rows), training_rows(rows)
    times, teacher = column(train, "train/step_time"), column(train, "distill/teacher_seconds")
    kl, agreement = column(train, "distill/kl"), column(train, "distill/argmax_agreement")
    return {
        "accuracy_by_step": accuracy,
        "accuracy_before": accuracy[0][1] if accuracy and accuracy[0][0] == 0 else None,
        "accuracy_after": accuracy[-1][1] if accuracy and accuracy[-1][0] == steps else None,
        "steps_trained": len(train),
        "seconds_per_step_median": statistics.median(times) if times else None,
        "teacher_share_median": statistics.median(t / s for t, s in zip(teacher, times, strict=True))
        if teacher and len(teacher) == len(times)
        else None,
        "distill_kl_first_last": [kl[0], kl[-1]] if kl else None,
        "argmax_agreement_first_last": [agreement[0], agreement[-1]] if agreement else None,
    }


def student(
    work: Path, seed: int, steps: int, system: str, prompts: int, every: int = 0, baseline: bool = True
) -> dict:
    """One student run from the CLI; a run folder whose last step's validation is there is read, not
    run again (its ``result.json`` is a summary of the folder)."""
    out = work / f"student_seed{seed}"
    overrides = [
        *TASK,
        *PURE,
        "algorithm.teacher.kind=context",
        quoted("algorithm.teacher.context.system_prompt", system),
    ]
    overrides += ["algorithm.beta=0", f"trainer.seed={seed}", f"trainer.max_steps={steps}", "logger=csv"]
    overrides += [
        f"eval.num_prompts={prompts}",
        f"eval.every_n_steps={every}",
        f"eval.before_training={str(baseline).lower()}",
    ]
    summary = summarize_student(metric_rows(out), steps)
    run = {"exit_code": 0, "wall_seconds": None, "load_average": None}
    if summary["accuracy_after"] is None:  # not run yet, or stopped before its end: from the start
        out.mkdir(parents=True, exist_ok=True)
        code, seconds, before, after = cli(overrides, out, out / "train.log")
        run = {"exit_code": code, "wall_seconds": seconds, "load_average": [before, after]}
        summary = summarize_student(metric_rows(out), steps)
    result = {"seed": seed, "command": command_line(overrides), **run, **summary}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"seed {seed}: held-out {result['accuracy_before']} -> {result['accuracy_after']}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/distill_ctx")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shots", type=int, default=3, help="worked examples in the teacher's system prompt")
    parser.add_argument("--eval-prompts", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=0, help="also validate every n steps (0: at the end only)")
    parser.add_argument(
        "--no-before", action="store_true", help="skip the validation before training (greedy: the same every seed)"
    )
    parser.add_argument("--out", help="the results' JSON (default: printed only)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    system = few_shot_prompt(args.shots)
    started = {"cpu": cpu_name(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    teacher = teacher_accuracy(work, system, args.eval_prompts)
    print(f"teacher (SmolLM2 with {args.shots} worked examples): held-out accuracy {teacher['accuracy']}", flush=True)
    runs = [
        student(work, seed, args.steps, system, args.eval_prompts, args.eval_every, not args.no_before)
        for seed in args.seeds
    ]
    results = {**started, "teacher_system_prompt": system, "teacher": teacher, "students": runs}
    results["load_average_end"] = os.getloadavg()
    print(json.dumps({k: v for k, v in results.items() if k != "teacher"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
