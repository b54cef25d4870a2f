"""rollout.mode=pipeline in whole runs with the HF engine: a CLI run killed by SIGKILL after a
checkpoint and resumed with trainer.resume=auto (which logs the pipeline's numbers and ends its
engine thread with the run), and a run stopped by SIGTERM, then resumed and killed by an error,
then resumed again, each train exactly the prompts of an uninterrupted run (none lost, none
repeated), and neither the stop nor the error leaves a thread behind."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import lightning as L
import pytest
from conftest import make_config

from grpo_lightning import train
from grpo_lightning.build import build_run
from grpo_lightning.runtime.checkpoints import checkpoints_in
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


def cli(folder, *args: str) -> None:
    """``grpo-lightning PIPELINE *args`` in this process, in ``folder``."""
    argv, cwd = sys.argv, os.getcwd()
    sys.argv = ["grpo-lightning", *[f"{k}={v}" for k, v in PIPELINE.items()], *args, f"hydra.run.dir={folder}"]
    os.chdir(folder)
    try:
        train.cli()
    finally:
        sys.argv = argv
        os.chdir(cwd)


def data_order(steps: int, output_dir) -> list[str]:
    """The prompts a sync run of ``steps`` steps trains: the data module's order for rank 0."""
    datamodule = build_run(make_config(steps, **{**PIPELINE, "trainer.output_dir": str(output_dir)})).datamodule
    return [datamodule.train_records[i]["prompt"] for i in datamodule.train_sampler(0, 1)][: steps * 3]


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
    assert Counter(trained) == Counter(data_order(6, tmp_path / "order"))  # the sync run's 18 prompts, each once


def test_a_sigkill_then_resume_auto_trains_exactly_the_uninterrupted_runs_prompts(tmp_path):
    """The CLI in a subprocess, killed by SIGKILL as soon as its step-2 checkpoint exists (it may have
    trained further, or written a later one), then ``trainer.resume=auto`` here; completions.jsonl holds
    every completion of every step, those the killed run trained after its checkpoint too."""
    args = ["trainer.max_steps=6", "logger=csv", "logger.report_png=false", "logger.table_every_n_steps=1"]
    args.append("logger.table_rows=6")  # a step's 3 groups x 2 samples
    overrides = [f"{k}={v}" for k, v in PIPELINE.items()]
    killed = subprocess.Popen(
        [sys.executable, "-m", "grpo_lightning.train", *overrides, *args, f"hydra.run.dir={tmp_path}"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    checkpoint = tmp_path / "checkpoints" / "step_00000002.ckpt"
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL, killed.stderr.read()[-2000:]
    samples = tmp_path / "completions.jsonl"
    before = [json.loads(line) for line in samples.read_text().splitlines()] if samples.exists() else []
    newest = checkpoints_in(tmp_path)[-1]  # what trainer.resume=auto takes: step 2's, or a later one
    resumed_at = int(newest.stem.split("_")[1])
    cli(tmp_path, *args, "trainer.resume=auto")
    after = [json.loads(line) for line in samples.read_text().splitlines()][len(before) :]
    assert after[0]["step"] == resumed_at >= 2  # it resumed there, it did not start again
    rows = [r for r in before if r["step"] < resumed_at] + after  # each step as the run that kept it trained it
    assert sorted({r["step"] for r in rows}) == list(range(6)) and len(rows) == 6 * 6
    trained = [r["prompt"] for r in rows[::2]]  # one row per group
    assert Counter(trained) == Counter(data_order(6, tmp_path / "order"))
    logged_where_time_went(tmp_path)
    assert not engine_threads()  # the CLI's shutdown ended the decode thread


def logged_where_time_went(folder) -> None:
    """The pipeline's metrics in the run's CSV: groups generated ahead were trained later (lag >= 1), the
    time fractions are fractions, and the staleness the bound reads is the pipeline's lag."""
    rows = [r for path in folder.glob("csv/version_*/metrics.csv") for r in csv.DictReader(path.open())]
    rows = [r for r in rows if r.get("pipeline/lag_max")]
    assert len(rows) >= 4
    assert max(float(r["pipeline/lag_max"]) for r in rows) >= 1
    for r in rows:
        for fraction in ("pipeline/engine_idle_fraction", "pipeline/trainer_wait_fraction"):
            assert 0.0 <= float(r[fraction]) <= 1.0
        assert float(r["pipeline/versions_per_sequence"]) >= 1.0
        assert float(r["rollout/staleness_max"]) == float(r["pipeline/lag_max"])
