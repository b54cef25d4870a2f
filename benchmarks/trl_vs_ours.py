"""Side by side: TRL's GRPOTrainer vs grpo_lightning on identical settings, in one run.

Same model (weights and tokenizer), prompts, generation batch (prompts x num_generations),
max completion length, beta, loss aggregation (TRL ``loss_type="grpo"`` = our
``seq_mean_token_mean``), learning rate, steps, gradient checkpointing (on by default, as
in TRL's GRPOConfig), HF ``generate`` for rollouts, one thread. Both see the raw prompt text
("3+4=", no chat template, which TRL applies only to conversational datasets) and neither
runs an evaluation pass; our health monitor stays on (it is part of our step).
The two trainers alternate ``--repeats`` times, each run in a fresh subprocess so that peak
RSS is its own. Reported per trainer: median step time (first ``--warmup`` steps dropped),
completion tokens per second through the whole step, the share of the step spent in
``generate``, peak RSS; then the ratio ours / TRL's of each.

    make bench-trl                       # creates .venv-bench (TRL + this package), runs this
    .venv-bench/bin/python benchmarks/trl_vs_ours.py --setting tiny
    .venv-bench/bin/python benchmarks/trl_vs_ours.py --setting smollm2 --model-dir DIR

Settings: ``tiny`` (the in-code model, 8 prompts x 8 generations x 32 tokens) and
``smollm2`` (a local SmolLM2-135M-Instruct folder, 4 prompts x 8 generations x 64 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "tiny": dict(prompts=8, generations=8, max_tokens=32, steps=30),
    "smollm2": dict(prompts=4, generations=8, max_tokens=64, steps=5),
}
COMMON = dict(beta=0.04, lr=3e-4, temperature=1.0)


def prompt_records(count: int) -> list[dict]:
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)][:count]


def save_tiny_model() -> str:
    """The in-code tiny model saved as a folder: both trainers load the very same files
    (TRL also re-loads its reference model from the policy's path)."""
    from grpo_lightning.config import ModelConfig
    from grpo_lightning.models import load_policy

    folder = tempfile.mkdtemp(prefix="tiny-policy-")
    model, tokenizer = load_policy(ModelConfig(name_or_path="tiny"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_model(model_dir: str):
    from grpo_lightning.config import ModelConfig
    from grpo_lightning.models import load_policy

    return load_policy(ModelConfig(name_or_path=model_dir))


class GenerateTimer:
    """Wraps ``model.generate`` on the instance and sums its wall time."""

    def __init__(self, model):
        self.seconds, inner = 0.0, model.generate

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        model.generate = timed


def trl_config(s: dict, checkpointing: bool, **overrides):
    """TRL's GRPOConfig for a setting ``s`` (prompts, generations, max_tokens, steps): our values."""
    from trl import GRPOConfig

    kwargs = dict(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=s["prompts"] * s["generations"],
        gradient_accumulation_steps=1, num_generations=s["generations"],
        max_completion_length=s["max_tokens"], beta=COMMON["beta"], loss_type="grpo",
        learning_rate=COMMON["lr"], lr_scheduler_type="constant", warmup_steps=0, max_steps=s["steps"],
        temperature=COMMON["temperature"], top_p=1.0, top_k=0, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, bf16=False, fp16=False, seed=0, dataloader_num_workers=0,
        max_grad_norm=1.0, num_iterations=1, scale_rewards="group", gradient_checkpointing=checkpointing,
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


def run_trl(setting: str, model_dir: str | None, checkpointing: bool) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_lightning.rewards.arithmetic import arithmetic_close

    s = SETTINGS[setting]
    model, tokenizer = load_model(model_dir)
    timer = GenerateTimer(model)
    steps: list[dict] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.gen = time.perf_counter(), timer.seconds

        def on_step_end(self, args, state, control, **kwargs):
            steps.append({"seconds": time.perf_counter() - self.start, "generate": timer.seconds - self.gen})

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and steps:
                steps[-1]["tokens"] = logs["completions/mean_length"] * s["prompts"] * s["generations"]

    config = trl_config(s, checkpointing)
    dataset = Dataset.from_list(prompt_records(max(64, s["prompts"] * s["steps"])))
    trainer = GRPOTrainer(
        model=model, reward_funcs=[arithmetic_close], args=config, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[StepTimes()],
    )
    trainer.train()
    return {"steps": steps}


def our_config(setting: str, model: str | None, checkpointing: bool, steps: int | None = None):
    """Our TrainConfig for a setting: the same values TRL's GRPOConfig gets in run_trl."""
    from grpo_lightning.config import TrainConfig

    s = SETTINGS[setting]
    cfg = TrainConfig()
    cfg.model.name_or_path = model
    cfg.model.gradient_checkpointing = checkpointing
    cfg.task.rewards = {"arithmetic_close": 1.0}
    cfg.task.chat_template = False  # TRL sees the raw prompt text: so do we
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations = s["prompts"], s["generations"]
    cfg.rollout.max_new_tokens, cfg.rollout.temperature = s["max_tokens"], COMMON["temperature"]
    cfg.algorithm.beta, cfg.algorithm.lr = COMMON["beta"], COMMON["lr"]
    cfg.algorithm.loss_agg, cfg.algorithm.micro_batch_size = "seq_mean_token_mean", s["prompts"] * s["generations"]
    cfg.trainer.max_steps, cfg.trainer.num_threads = steps or s["steps"], 1
    cfg.trainer.output_dir, cfg.logger.kind = tempfile.mkdtemp(), "none"
    return cfg


def run_ours(setting: str, model_dir: str | None, checkpointing: bool) -> dict:
    import lightning as L

    from grpo_lightning.build import build_run

    cfg = our_config(setting, model_dir, checkpointing)
    run = build_run(cfg)
    steps: list[dict] = []

    class StepTimes(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            rollout = module.last_step.rollout
            steps.append({
                "seconds": time.perf_counter() - self.start,
                "generate": rollout.timing["rollout/seconds"],
                "tokens": float(rollout.completion_mask.sum()),
            })

    run.callbacks.insert(0, StepTimes())  # its clock starts before training_step generates
    run.trainer(cfg, enable_progress_bar=False, limit_val_batches=0).fit(run.module, datamodule=run.datamodule)
    return {"steps": steps}


def child(trainer: str, setting: str, model_dir: str | None, checkpointing: bool) -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = (run_trl if trainer == "trl" else run_ours)(setting, model_dir, checkpointing)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def summarize(runs: list[dict], warmup: int) -> dict:
    steps = [step for run in runs for step in run["steps"][warmup:]]
    seconds = [s["seconds"] for s in steps]
    return {
        "median_step_s": statistics.median(seconds),
        "tokens_per_s": sum(s.get("tokens", 0.0) for s in steps) / sum(seconds),
        "generation_share": sum(s["generate"] for s in steps) / sum(seconds),
        "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
        "steps_measured": len(steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--model-dir", help="local SmolLM2-135M-Instruct folder (setting smollm2)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two trainers")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out")
    parser.add_argument("--json", help="results file (default benchmarks/results/trl_vs_ours_<setting>.json)")
    parser.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on",
                        help="the same for both trainers (TRL's GRPOConfig default is on)")
    parser.add_argument("--child", choices=["trl", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.setting == "smollm2" and not args.model_dir:
        parser.error("--setting smollm2 needs --model-dir (a local SmolLM2-135M-Instruct folder)")
    if args.child:
        child(args.child, args.setting, args.model_dir, args.gradient_checkpointing == "on")
        return
    model_dir = args.model_dir or save_tiny_model()
    runs: dict[str, list] = {"ours": [], "trl": []}
    for repeat in range(args.repeats):
        for trainer in ("ours", "trl"):
            command = [sys.executable, __file__, "--child", trainer, "--setting", args.setting, "--model-dir", model_dir,
                       "--gradient-checkpointing", args.gradient_checkpointing]
            print(f"[{repeat + 1}/{args.repeats}] {trainer} ...", file=sys.stderr, flush=True)
            done = subprocess.run(command, capture_output=True, text=True)
            line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
            if done.returncode or not line:
                sys.exit(f"{trainer} run failed:\n{done.stderr[-4000:]}")
            runs[trainer].append(json.loads(line[-1][len("RESULT "):]))
    table = {name: summarize(r, args.warmup) for name, r in runs.items()}
    s = SETTINGS[args.setting]
    print(f"setting {args.setting}: {s['prompts']} prompts x {s['generations']} generations x {s['max_tokens']} tokens, "
          f"{s['steps']} steps x {args.repeats} runs each (first {args.warmup} dropped), 1 thread, HF generate, "
          f"gradient checkpointing {args.gradient_checkpointing}")
    rows = [("median step (s)", "median_step_s", "{:.3f}"), ("completion tokens/s", "tokens_per_s", "{:.1f}"),
            ("generation share", "generation_share", "{:.2f}"), ("peak RSS (MB)", "peak_rss_mb", "{:.0f}")]
    print(f"{'metric':<22}{'ours':>10}{'TRL':>10}{'ours/TRL':>10}")
    for label, key, fmt in rows:
        ours, trl = table["ours"][key], table["trl"][key]
        print(f"{label:<22}{fmt.format(ours):>10}{fmt.format(trl):>10}{ours / trl:>10.2f}")
    args.json = args.json or f"benchmarks/results/trl_vs_ours_{args.setting}.json"
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    import trl

    Path(args.json).write_text(json.dumps({"setting": args.setting, "config": s, "common": COMMON, "threads": 1,
                                           "trl_version": trl.__version__, "gradient_checkpointing": args.gradient_checkpointing,
                                           "results": table, "runs": runs}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
