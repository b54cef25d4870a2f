"""What measuring the engine-trainer mismatch costs per training step (mismatch/* and the F8 check).

The metrics reuse the first pass's log-probs (no extra forward), so their cost is the tensor math
of ``step.passes.measure_mismatch`` and ``algorithm.mismatch.mismatch_metrics`` plus the F8 check's
``measure``/``evaluate``. Each is timed where it runs (wall clock, a synchronize first on a GPU),
summed per step and divided by the step time of the same run (first callback's
``on_train_batch_start`` to the last one's ``on_train_batch_end``). The HF engine reports its
log-probs, so the default run measures them every step.

    python benchmarks/mismatch_cost.py --model tiny --steps 30
    python benchmarks/mismatch_cost.py --model smollm2_135m --steps 6 --prompts 4 --generations 4 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import lightning as L
import torch

import grpo_lightning.step.module as module_file
from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.health.mismatch import MismatchCheck

SPENT = {"metrics": 0.0, "check": 0.0}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, bucket: str):
    def wrapper(*args, **kwargs):
        _sync()
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _sync()
            SPENT[bucket] += time.perf_counter() - start

    return wrapper


class StepStart(L.Callback):
    """The first callback: the step starts (and the buckets empty) here."""

    def __init__(self):
        self.start = 0.0

    def on_train_batch_start(self, *args) -> None:
        _sync()
        SPENT.update(metrics=0.0, check=0.0)
        self.start = time.perf_counter()


class StepEnd(L.Callback):
    """The last callback: after the health monitor, so the F8 check is inside the step."""

    def __init__(self, start: StepStart):
        self.clock, self.rows = start, []

    def on_train_batch_end(self, *args) -> None:
        _sync()
        self.rows.append({"step": time.perf_counter() - self.clock.start, **SPENT})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--accelerator", default="cpu")
    args = parser.parse_args()

    module_file.measure_mismatch = timed(module_file.measure_mismatch, "metrics")
    module_file.mismatch_metrics = timed(module_file.mismatch_metrics, "metrics")
    MismatchCheck.measure = timed(MismatchCheck.measure, "check")
    MismatchCheck.evaluate = timed(MismatchCheck.evaluate, "check")

    cfg = TrainConfig()
    cfg.model.name_or_path = args.model
    cfg.trainer.max_steps = args.steps
    cfg.trainer.accelerator = args.accelerator
    cfg.logger.kind = "none"
    cfg.rollout.prompts_per_step = args.prompts
    cfg.rollout.num_generations = args.generations
    cfg.rollout.max_new_tokens = args.tokens
    cfg.eval.before_training = False
    cfg.eval.num_prompts = 0
    run = build_run(cfg)
    start = StepStart()
    clock = StepEnd(start)
    trainer = run.trainer(cfg, callbacks=[start, *run.callbacks, clock], enable_progress_bar=False, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(run.module, datamodule=run.datamodule)
    rows = clock.rows[args.warmup :]
    step = statistics.median(r["step"] for r in rows)
    metrics = statistics.median(r["metrics"] for r in rows)
    check = statistics.median(r["check"] for r in rows)
    assert run.module.last_metrics.get("mismatch/tokens", 0) > 0, "no mismatch measured: no engine log-probs?"
    print(
        json.dumps(
            {
                "model": args.model,
                "device": torch.cuda.get_device_name() if args.accelerator == "gpu" else "cpu",
                "batch": f"{args.prompts}x{args.generations}x{args.tokens} tokens",
                "steps_timed": len(rows),
                "step_s_median": round(step, 5),
                "mismatch_metrics_s_median": round(metrics, 6),
                "f8_check_s_median": round(check, 6),
                "share_metrics_pct": round(100 * metrics / step, 3),
                "share_metrics_and_check_pct": round(100 * (metrics + check) / step, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
