"""Side by side on a vision-language policy: TRL's GRPOTrainer vs grpo_lightning, step time and peak memory.

Both trainers get the same tiny VLM folder (``model=tiny_vlm``'s LLaVA family saved once, or
``--family qwen2_vl``), the same task=shapes rows (chat prompts with an ``image`` column of PIL
pictures, TRL's format), the same generation batch (prompts x num_generations), completion length,
beta 0.04, loss aggregation (TRL ``loss_type="grpo"`` = our ``seq_mean_token_mean``), learning
rate, steps, reward (``shapes_exact``), float32, one thread, gradient checkpointing off, every
weight trained (``model.freeze_vision=false``: TRL freezes nothing), no evaluation; our health
monitor stays on. Each trainer generates with the policy itself (TRL's ``model.generate``, ours
the HF engine's own loop). The trainers alternate ``--repeats`` times, each run in a fresh
subprocess so that its peak RSS is its own. Reported per trainer: median step time (from a
step's start to the next one's; the first ``--warmup`` steps dropped), in wall seconds and in the
process's CPU seconds (on a machine shared with other jobs the wall seconds count their turns on
the cores too: compare the CPU seconds there), the share spent generating, peak RSS; then ours / TRL's.

    .venv-bench/bin/python benchmarks/vision_trl.py                      # TRL's venv (make bench-trl builds it)
    .venv-bench/bin/python benchmarks/vision_trl.py --repeats 3 --out benchmarks/results/vision_trl.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

import torch
from trl_vs_ours import GenerateTimer, child_environment, close_step, open_step, summarize, trl_config, trl_step_times

from grpo_lightning.config import ModelConfig, TrainConfig
from grpo_lightning.models import load_policy
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.models.vision.tiny import build_tiny_vlm, build_vision_tokenizer
from grpo_lightning.tasks.shapes import shapes_exact, shapes_records

SETTING = dict(prompts=8, generations=8, max_tokens=4, steps=10)
COMMON = dict(beta=0.04, lr=3e-4, temperature=1.0)


def save_model(family: str) -> str:
    """The tiny VLM of ``family`` saved as a folder: both trainers load the very same files."""
    folder = tempfile.mkdtemp(prefix=f"tiny-vlm-{family}-")
    model, processor = build_tiny_vlm(build_vision_tokenizer(family), family)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def rows(count: int) -> list[dict]:
    """task=shapes questions in TRL's format: a chat prompt and one ``image``."""
    return [
        {"prompt": r["prompt"], "image": r["images"][0], "answer": r["answer"], "question_type": r["question_type"]}
        for r in shapes_records(count, 32, ("color", "shape", "count", "side"), seed=0)
    ]


def run_trl(model_dir: str, s: dict) -> dict:
    from datasets import Dataset  # noqa: PLC0415  (optional: TRL's venv)
    from trl import GRPOTrainer  # noqa: PLC0415  (optional: TRL's venv)

    model, tokenizer = load_policy(ModelConfig(name_or_path=model_dir, freeze_vision="false"))
    timer, steps = GenerateTimer(model), []
    config = trl_config({**s, "lr": COMMON["lr"]}, checkpointing=False)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[shapes_exact],
        args=config,
        train_dataset=Dataset.from_list(rows(max(64, s["prompts"] * s["steps"]))),
        processing_class=processor_of(tokenizer),
        callbacks=[trl_step_times(timer, steps, s["prompts"] * s["generations"])],
    )
    trainer.train()
    return {"steps": steps}


def our_config(model_dir: str, s: dict) -> TrainConfig:
    """Our TrainConfig: the values TRL's GRPOConfig gets in run_trl."""
    cfg = TrainConfig()
    cfg.model.name_or_path, cfg.model.freeze_vision, cfg.model.gradient_checkpointing = model_dir, "false", "false"
    cfg.task.rewards, cfg.task.correctness_reward = {"shapes_exact": 1.0}, None
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations = s["prompts"], s["generations"]
    cfg.rollout.max_new_tokens, cfg.rollout.temperature = s["max_tokens"], COMMON["temperature"]
    cfg.algorithm.beta, cfg.algorithm.lr = COMMON["beta"], COMMON["lr"]
    cfg.algorithm.loss_agg, cfg.algorithm.micro_batch_size = "seq_mean_token_mean", s["prompts"] * s["generations"]
    cfg.trainer.max_steps, cfg.trainer.num_threads = s["steps"], 1
    cfg.trainer.output_dir, cfg.logger.kind = tempfile.mkdtemp(), "none"
    return cfg


def run_ours(model_dir: str, s: dict) -> dict:
    import lightning as L  # noqa: PLC0415  (allocates: after the child's thread setting)

    from grpo_lightning.build import build_run  # noqa: PLC0415  (imports lightning)

    cfg = our_config(model_dir, s)
    run = build_run(cfg, train_dataset=rows(max(64, s["prompts"] * s["steps"])))
    steps: list[dict] = []

    class StepTimes(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            close_step(steps)
            steps.append(open_step())

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            rollout = module.last_step.rollout
            steps[-1]["generate"] = rollout.timing["rollout/seconds"]
            steps[-1]["tokens"] = float(rollout.completion_mask.sum())  # as TRL's: completion tokens

        def on_train_end(self, trainer, module):
            close_step(steps)

    run.callbacks.insert(0, StepTimes())
    run.trainer(cfg, enable_progress_bar=False, limit_val_batches=0).fit(run.module, datamodule=run.datamodule)
    return {"steps": steps}


def child(trainer: str, model_dir: str, steps: int) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    s = {**SETTING, "steps": steps}
    result = run_trl(model_dir, s) if trainer == "trl" else run_ours(model_dir, s)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="llava", choices=["llava", "qwen2_vl"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=SETTING["steps"])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--trainers", default="ours,trl", help="which trainers to run, in turn")
    parser.add_argument("--out", default=None, help="write the summary as JSON here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model_dir, args.steps)
        return
    model_dir = save_model(args.family)
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for trainer in args.trainers.split(","):
            command = [
                sys.executable,
                __file__,
                "--child",
                trainer,
                "--model-dir",
                model_dir,
                "--steps",
                str(args.steps),
            ]
            done = subprocess.run(command, capture_output=True, text=True, env=child_environment(trainer))
            if done.returncode != 0:
                raise SystemExit(f"the {trainer} run failed:\n{done.stderr[-3000:]}")
            line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
            runs.setdefault(trainer, []).append(json.loads(line[len("RESULT ") :]))
    summary = {trainer: summarize(found, args.warmup) for trainer, found in runs.items()}
    if "ours" in summary and "trl" in summary:
        summary["ratio"] = {
            "step_time": summary["ours"]["median_step_s"] / summary["trl"]["median_step_s"],
            "step_cpu_time": summary["ours"]["median_step_cpu_s"] / summary["trl"]["median_step_cpu_s"],
            "peak_rss": summary["ours"]["peak_rss_mb"] / summary["trl"]["peak_rss_mb"],
        }
    summary["setting"] = {**SETTING, "steps": args.steps, "family": args.family, "repeats": args.repeats}
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=2)


if __name__ == "__main__":
    main()
