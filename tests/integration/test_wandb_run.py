"""The wandb dashboard's inputs, read back from an offline run folder written by the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.wandb_offline import config, history

pytestmark = pytest.mark.slow


def test_offline_run_holds_metrics_completions_table_and_resolved_config(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_lightning.train",
            "logger=wandb",
            "trainer.max_steps=4",
            "rollout.prompts_per_step=4",
            "algorithm.micro_batch_size=16",
            "logger.table_every_n_steps=2",
            "logger.table_rows=8",
            "eval.every_n_steps=2",
            "eval.num_prompts=8",
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    rows = history(run_dir)

    train_rows = [r for r in rows if "reward/mean" in r]
    assert len(train_rows) == 4
    for name in (
        "train/loss",
        "train/grad_norm",
        "train/lr",
        "reward/std",
        "reward/frac_zero_std",
        "reward/arithmetic_exact/mean",
        "kl/mean",
        "policy/entropy",
        "completions/mean_length",
        "health/skipped_steps_total",
        "rollout/tokens_per_s",
    ):
        assert all(isinstance(r.get(name), (int, float)) for r in train_rows), name
    val_rows = [r for r in rows if "val/accuracy" in r]
    assert len(val_rows) == 3  # before training, after step 2, after step 4
    assert all(0.0 <= r["val/accuracy"] <= 1.0 for r in val_rows)

    tables = [r for r in rows if r.get("completions/_type") == "table-file"]
    assert len(tables) == 2  # steps 0 and 2
    files = sorted((run_dir / "files" / "media" / "table").glob("completions_*.table.json"))
    assert len(files) == 2
    table = json.loads(files[0].read_text())
    assert table["columns"] == [
        "step",
        "prompt",
        "completion",
        "reward/arithmetic_exact",
        "reward/arithmetic_close",
        "reward",
        "advantage",
    ]
    assert len(table["data"]) == 8
    for row in table["data"]:
        assert row[1].endswith("=") and isinstance(row[2], str)
        assert row[5] == pytest.approx(0.5 * row[3] + 0.5 * row[4], abs=1e-5)
    group = [row[6] for row in table["data"][:8]]  # one group of 8: advantages sum to ~0
    assert abs(sum(group)) < 1e-3

    logged = config(run_dir)
    assert logged["task"]["name"] == "arithmetic"
    assert logged["rollout"]["prompts_per_step"] == 4
    assert logged["trainer"]["output_dir"] == str(tmp_path / "run")  # resolved, not ${hydra:...}
    assert "eval" in logged and logged["eval"]["every_n_steps"] == 2
