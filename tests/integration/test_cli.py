"""The Hydra CLI as a user runs it: a short training, a rejected override, a multirun."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SHORT = ["trainer.max_steps=3", "rollout.prompts_per_step=4", "algorithm.micro_batch_size=16"]


def train(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "grpo_lightning.train", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def read_metrics(folder: Path) -> list[dict]:
    files = list(folder.glob("csv/version_*/metrics.csv"))
    assert len(files) == 1, files
    with open(files[0]) as handle:
        return list(csv.DictReader(handle))


def test_cli_trains_and_logs_metrics(tmp_path):
    result = train(*SHORT, "logger=csv", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(tmp_path / "run")
    rows = [r for r in metrics if r.get("reward/mean")]
    assert len(rows) == 3
    assert {"train/loss", "kl/mean", "reward/frac_zero_std", "policy/entropy"} <= set(rows[0])
    # held-out evaluation before training and at the end, as in the hand-assembled API (test_dataflow)
    assert len([r for r in metrics if r.get("val/accuracy")]) == 2
    assert "final metrics" in result.stdout


def test_cli_rejects_a_bad_override_naming_the_field(tmp_path):
    result = train("algorithm.beta=-1", "algorithm.loss_agg=avg", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert result.returncode == 2
    assert "algorithm.beta=-1.0 must be >= 0" in result.stderr
    assert "algorithm.loss_agg='avg' is not a registered loss aggregation mode" in result.stderr
    assert "token_mean" in result.stderr


def test_cli_multirun_over_loss_modes(tmp_path):
    result = train(
        "-m",
        *SHORT,
        "logger=csv",
        "algorithm.loss_agg=token_mean,seq_mean_token_mean",
        f"hydra.sweep.dir={tmp_path}/sweep",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert len([r for r in read_metrics(tmp_path / "sweep" / job) if r.get("reward/mean")]) == 3
    modes = [(tmp_path / "sweep" / j / ".hydra" / "overrides.yaml").read_text() for j in ("0", "1")]
    assert "token_mean" in modes[0] and "seq_mean_token_mean" in modes[1]
