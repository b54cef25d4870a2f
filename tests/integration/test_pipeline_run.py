"""rollout.mode=pipeline in whole runs with the HF engine: the CLI trains and logs the pipeline's
numbers, and its engine thread ends with the run; a run stopped by SIGTERM, then resumed and killed
by an error, then resumed again, trains exactly the prompts of an uninterrupted run (none lost,
none repeated), and neither the stop nor the error leaves a thread behind."""

from __future__ import annotations

import csv
import os
import signal
import sys
import threading
from collections import Counter

import lightning as L
import pytest
from conftest import make_config

from grpo_lightning import train
from grpo_lightning.build import build_run
from tests.helpers.runs import train as fit_run

PIPELINE = {
    "rollout.mode": "pipeline",
    "rollout.prompts_per_step": 3,
    "rollout.num_generations": 2,
    "rollout.max_new_tokens": 6,
    "rollout.pipeline.max_lag": 2,
    "algorithm.micro_batch_size": 6,
    "trainer.checkpoint_every_n_steps": 2,
    "eval.before_training": False,
    "eval.num_prompts": 2,
}


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pipeline-hf-engine"]


def test_the_cli_trains_in_pipeline_mode_and_logs_where_time_went(tmp_path):
    argv, cwd = sys.argv, os.getcwd()
    overrides = [f"{k}={v}" for k, v in PIPELINE.items()]
    sys.argv = [
        "grpo-lightning",
        *overrides,
        "trainer.max_steps=4",
        "logger=csv",
        "logger.report_png=false",
        f"hydra.run.dir={tmp_path}",
    ]
    os.chdir(tmp_path)
    try:
        train.cli()
    finally:
        sys.argv = argv
        os.chdir(cwd)
    (metrics,) = tmp_path.glob("csv/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("pipeline/lag_max")]
    assert len(rows) == 4
    assert max(float(r["pipeline/lag_max"]) for r in rows) >= 1  # groups generated ahead were trained later
    for r in rows:
        for fraction in ("pipeline/engine_idle_fraction", "pipeline/trainer_wait_fraction"):
            assert 0.0 <= float(r[fraction]) <= 1.0
        assert float(r["pipeline/versions_per_sequence"]) >= 1.0
        assert float(r["rollout/staleness_max"]) == float(r["pipeline/lag_max"])
    assert not engine_threads()  # the CLI's shutdown ended the decode thread


class Prompts(L.Callback):
    """The prompts of every trained batch; SIGTERM or an error at a given batch."""

    def __init__(self, sigterm_at: int | None = None, fail_at: int | None = None):
        self.prompts: list[str] = []
        self.sigterm_at, self.fail_at = sigterm_at, fail_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if trainer.global_step == self.fail_at:
            raise RuntimeError("killed at step 4")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollout = pl_module.last_step.rollout
        self.prompts += rollout.prompts[:: rollout.group_size]


def test_stops_and_crashes_resume_without_losing_or_repeating_a_prompt(tmp_path):
    def cfg(**more):
        return make_config(6, **{**PIPELINE, "trainer.output_dir": str(tmp_path), **more})

    stopped = Prompts(sigterm_at=1)
    run, trainer = fit_run(cfg(), stopped)
    assert run.checkpoints.interrupted == signal.SIGTERM and trainer.global_step == 2
    run.module.rollout.shutdown()  # what the CLI does when fit returns
    assert not engine_threads()

    crashed = Prompts(fail_at=4)
    with pytest.raises(RuntimeError, match="killed at step 4"):
        fit_run(cfg(**{"trainer.resume": "auto"}), crashed)
    assert not engine_threads()  # the error closed the engine

    rest = Prompts()
    run, trainer = fit_run(cfg(**{"trainer.resume": "auto"}), rest)  # from step 4's checkpoint
    run.module.rollout.shutdown()
    assert trainer.global_step == 6
    trained = stopped.prompts + crashed.prompts[: 3 * 2] + rest.prompts  # the crashed run's steps 2-3
    order = build_run(cfg()).datamodule
    sampler = order.train_sampler(0, 1)
    want = [order.train_records[i]["prompt"] for i in sampler][: 6 * 3]
    assert Counter(trained) == Counter(want)  # the sync run's 18 prompts, each once
