"""Where one GRPO step's time goes, ours vs TRL's GRPOTrainer, at identical settings.

The settings are those of ``trl_vs_ours.py``'s identical table (HF ``generate`` for both,
gradient checkpointing on, float32, one thread, the same model files, prompts, batch and
reward). ``--table fastest`` profiles each trainer's fastest tiny configuration instead (ours:
the fused decoder and checkpointing ``auto``; TRL: checkpointing off); ``--table default``
ours with its default decoder (``rollout.hf_decoder=fused``) at otherwise identical settings;
``--trainers ours`` profiles ours alone (before/after a change). Each trainer runs in a fresh process, alternating ``--repeats`` times; inside it the
functions that do each part of the step are wrapped with timers. A timer counts its own time
only (a nested timer's time goes to the nested part), so the parts add up to the step:

- generation: the decoder (ours: the engine's ``generate``; TRL: ``model.generate``);
- rewards and batch: scoring and the generation batch's assembly (the rest of the rollout);
- reference forward: the frozen reference's log-probs;
- policy fwd/bwd: the loss's forward and backward over every micro-batch;
- optimizer: gradient norm and clipping, the optimizer and LR scheduler step (ours: also the
  update guard, shown on its own row);
- mismatch metrics: the engine-trainer mismatch sums and their metrics (ours only);
- metrics/logging: the step's metrics and their writing (ours: ``step_metrics``, ``self.log``,
  the loggers; TRL: ``log``);
- callbacks: every callback's step hooks (ours: the health monitor and the others; TRL's
  callback handler), less the profiler's own;
- other: the rest of the step (the training loop, data loading, preparation).

``--clock cpu`` counts the main thread's CPU time instead of wall time: steadier where other
work shares the machine (both trainers compute in that one thread). Each step is timed from its start to the next one's, as in ``trl_vs_ours.py``; the first
``--warmup`` steps of each run are left out. Printed: mean milliseconds per step per part.

    PYTHONPATH=. .venv-bench/bin/python benchmarks/step_profile.py [--steps 20 --repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from trl_vs_ours import SETTINGS, child_environment, load_model, our_config, prompt_records, save_tiny_model, trl_config

from grpo_lightning.models.allocator import prefer_huge_pages
from grpo_lightning.tasks.arithmetic import arithmetic_close

PARTS = (
    "generation",
    "rewards and batch",
    "reference forward",
    "policy fwd/bwd",
    "optimizer",
    "update guard",
    "mismatch metrics",
    "metrics/logging",
    "callbacks",
    "other",
)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
CLOCK = CLOCKS["wall"]  # set by --clock in the child


class Timers:
    """Exclusive time per part: a timed call nested in another is taken out of the outer one."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(PARTS, 0.0)
        self.stack: list[list] = []  # [part, start, nested seconds]

    def wrap(self, owner, name: str, part) -> None:
        """Time ``owner.name`` (on the instance, or the module attribute) as ``part`` (or part(args))."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            label = part(*args) if callable(part) else part
            self.stack.append([label, CLOCK(), 0.0])
            try:
                return inner(*args, **kwargs)
            finally:
                label, start, nested = self.stack.pop()
                elapsed = CLOCK() - start
                self.totals[label] += elapsed - nested
                if self.stack:
                    self.stack[-1][2] += elapsed

        setattr(owner, name, timed)


class Steps:
    """Step boundaries: each step from its start to the next one's, with the parts measured in it."""

    def __init__(self, timers: Timers) -> None:
        self.timers, self.steps, self.start, self.mark = timers, [], None, None

    def boundary(self) -> None:
        now = CLOCK()
        if self.start is not None:
            parts = {k: v - self.mark[k] for k, v in self.timers.totals.items()}
            parts["other"] = (now - self.start) - sum(parts.values())
            self.steps.append({"seconds": now - self.start, "parts": parts})
        self.start, self.mark = now, dict(self.timers.totals)


def hook_callbacks(timers: Timers, callbacks, hooks: tuple[str, ...], base, skip) -> None:
    """Time every callback's own ``hooks`` (those it overrides from ``base``) as callbacks."""
    for callback in callbacks:
        for hook in hooks:
            if callback is not skip and getattr(type(callback), hook) is not getattr(base, hook):
                timers.wrap(callback, hook, "callbacks")


# Per --table: our (checkpointing, decoder) and TRL's checkpointing.
TABLES = {
    "identical": dict(checkpointing=True, hf_decoder="generate", trl_checkpointing=True),
    "default": dict(checkpointing=True, hf_decoder="fused", trl_checkpointing=True),
    "fastest": dict(checkpointing="auto", hf_decoder="fused", trl_checkpointing=False),
}


def profile_ours(setting: str, model_dir: str, table: str = "identical") -> list[dict]:
    # Each imports lightning, which allocates: after child() applies huge pages.
    import lightning as L  # noqa: PLC0415  (after the huge-pages choice)

    import grpo_lightning.step.hooks as hooks_file  # noqa: PLC0415  (after the huge-pages choice)
    import grpo_lightning.step.module as module_file  # noqa: PLC0415  (after the huge-pages choice)
    from grpo_lightning.build import build_run  # noqa: PLC0415  (after the huge-pages choice)

    t = TABLES[table]
    cfg = our_config(setting, model_dir, t["checkpointing"], engine="hf", hf_decoder=t["hf_decoder"])
    run = build_run(cfg)
    timers = Timers()
    steps = Steps(timers)

    class Boundary(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            steps.boundary()

        def on_train_end(self, trainer, module):
            steps.boundary()

    boundary = Boundary()
    run.callbacks.insert(0, boundary)
    trainer = run.trainer(cfg, enable_progress_bar=False, limit_val_batches=0)
    module, generator = run.module, run.module.rollout
    timers.wrap(module, "generate_rollout", "rewards and batch")
    setup = generator.setup

    def setup_and_time(policy):  # the engine exists once the generator is set up
        setup(policy)
        timers.wrap(generator.engine, "generate", "generation")

    generator.setup = setup_and_time
    timers.wrap(module, "_reference_log_probs", "reference forward")
    timers.wrap(module, "accumulate_gradients", "policy fwd/bwd")
    timers.wrap(module, "_guarded_step", "optimizer")
    timers.wrap(module_file, "nonfinite_update_count", "update guard")
    for name in ("measure_mismatch", "mismatch_metrics"):
        timers.wrap(module_file, name, "mismatch metrics")
    for name in ("step_metrics", "log_callback_metrics"):
        timers.wrap(module_file, name, "metrics/logging")
    timers.wrap(hooks_file, "write_metrics", "metrics/logging")
    timers.wrap(module, "on_train_batch_end", "callbacks")  # the weight push (nothing to push with HF)
    hook_callbacks(timers, trainer.callbacks, ("on_train_batch_start", "on_train_batch_end"), L.Callback, boundary)
    trainer.fit(module, datamodule=run.datamodule)
    return steps.steps


def profile_trl(setting: str, model_dir: str, table: str = "identical") -> list[dict]:
    from datasets import Dataset  # noqa: PLC0415  (optional: TRL's venv)
    from transformers import TrainerCallback  # noqa: PLC0415  (TRL's side; allocates: not before ours' huge pages)
    from trl import GRPOTrainer  # noqa: PLC0415  (optional: TRL's venv)

    s = SETTINGS[setting]
    model, tokenizer = load_model(model_dir)
    timers = Timers()
    steps = Steps(timers)

    class Boundary(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            steps.boundary()

        def on_train_end(self, args, state, control, **kwargs):
            steps.boundary()

    dataset = Dataset.from_list(prompt_records(max(64, s["prompts"] * s["steps"]), s["prompts_from"], tokenizer))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_close],
        args=trl_config(s, checkpointing=TABLES[table]["trl_checkpointing"]),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Boundary()],
    )
    timers.wrap(model, "generate", "generation")
    timers.wrap(trainer, "_generate_and_score_completions", "rewards and batch")
    ref = trainer.ref_model
    timers.wrap(
        trainer,
        "_get_per_token_logps_and_entropies",
        lambda model, *a: "reference forward" if model is ref else "policy fwd/bwd",
    )
    timers.wrap(trainer, "compute_loss", "policy fwd/bwd")
    timers.wrap(trainer.accelerator, "backward", "policy fwd/bwd")
    timers.wrap(trainer.accelerator, "clip_grad_norm_", "optimizer")
    timers.wrap(trainer, "log", "metrics/logging")
    handler = trainer.callback_handler
    for event in ("on_step_end", "on_log", "on_optimizer_step", "on_pre_optimizer_step", "on_substep_end"):
        timers.wrap(handler, event, "callbacks")  # on_step_begin holds the boundary: its time goes to "other"

    class OptimizerTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            timers.wrap(optimizer, "step", "optimizer")
            timers.wrap(lr_scheduler, "step", "optimizer")

    trainer.add_callback(OptimizerTimer())
    trainer.train()
    return steps.steps


def child(trainer: str, setting: str, model_dir: str, clock: str, table: str) -> None:
    global CLOCK
    CLOCK = CLOCKS[clock]
    if trainer == "ours":  # as trl_vs_ours.py: before torch's first allocation, as the CLI does
        prefer_huge_pages()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    steps = profile_ours(setting, model_dir, table) if trainer == "ours" else profile_trl(setting, model_dir, table)
    print("RESULT " + json.dumps(steps))


def run_child(trainer: str, args, model_dir: str) -> list[dict]:
    command = [sys.executable, __file__, "--child", trainer, "--setting", args.setting, "--model-dir", model_dir]
    command += ["--steps", str(args.steps), "--clock", args.clock, "--table", args.table]
    done = subprocess.run(command, capture_output=True, text=True, env=child_environment(trainer))
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not line:
        sys.exit(f"{trainer} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT ") :])


def table(runs: dict[str, list[list[dict]]], warmup: int) -> str:
    """Mean ms per step per part (and its share), the trainers side by side; the median step below."""
    kept = {name: [step for run in r for step in run[warmup:]] for name, r in runs.items() if r}
    mean = {name: {p: statistics.mean(s["parts"][p] for s in steps) for p in PARTS} for name, steps in kept.items()}
    total = {name: statistics.mean(s["seconds"] for s in steps) for name, steps in kept.items()}
    median = {name: statistics.median(s["seconds"] for s in steps) for name, steps in kept.items()}
    names = list(kept)
    lines = ["| part | " + " | ".join(f"{n} (ms) | share" for n in names) + " |", "|---|" + "---|---|" * len(names)]
    for part in PARTS:
        cells = [f"{mean[n][part] * 1e3:.1f} | {mean[n][part] / total[n]:.0%}" for n in names]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("| **step (mean)** | " + " | ".join(f"**{total[n] * 1e3:.1f}** | " for n in names) + "|")
    ratio = f" ours/TRL {median['ours'] / median['trl']:.2f}" if len(names) == 2 else ""
    lines.append("| step (median) | " + " | ".join(f"{median[n] * 1e3:.1f} | " for n in names) + f"{ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--model-dir", help="local SmolLM2-135M-Instruct folder (settings smollm2, smollm2_rg)")
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two trainers")
    parser.add_argument("--warmup", type=int, default=3, help="first steps of each run left out")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: wall time; cpu: this thread's CPU time (steadier on a machine other work shares)",
    )
    parser.add_argument("--table", choices=sorted(TABLES), default="identical", help="which configurations (above)")
    parser.add_argument(
        "--trainers", nargs="+", choices=["ours", "trl"], default=["ours", "trl"], help="who to profile"
    )
    parser.add_argument("--json", help="results file (default benchmarks/results/step_profile_<setting>_<table>.json)")
    parser.add_argument("--child", choices=["trl", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    SETTINGS[args.setting]["steps"] = args.steps
    if args.child:
        child(args.child, args.setting, args.model_dir, args.clock, args.table)
        return
    if args.setting != "tiny" and not args.model_dir:
        parser.error(f"--setting {args.setting} needs --model-dir")
    model_dir = args.model_dir or save_tiny_model()
    runs: dict[str, list] = {"ours": [], "trl": []}
    for repeat in range(args.repeats):
        for trainer in args.trainers:
            print(f"[{repeat + 1}/{args.repeats}] {trainer} ...", file=sys.stderr, flush=True)
            runs[trainer].append(run_child(trainer, args, model_dir))
    print(table(runs, args.warmup))
    suffix = "" if args.table == "identical" else f"_{args.table}"
    path = Path(args.json or f"benchmarks/results/step_profile_{args.setting}{suffix}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"setting": args.setting, "table": args.table, "steps": args.steps, "clock": args.clock, "runs": runs},
            indent=1,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
