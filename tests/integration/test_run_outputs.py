"""A short CLI run as a user sees it: a quiet console whose last lines name every output, a
report, a summary and samples in the output folder, a non-empty train.log, and a resume that
continues the same CSV (one row per step) and report."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ARGS = [
    "trainer.max_steps=4",
    "trainer.checkpoint_every_n_steps=2",
    "rollout.prompts_per_step=4",
    "algorithm.micro_batch_size=16",
    "logger=csv",
    "logger.table_every_n_steps=2",
    "logger.table_rows=4",
    "algorithm.warmup_steps=2",  # lr factors 1/3, 2/3, 1: the logged lr must be the one each step used
]
# Lines a user did not ask for (issue 28, part 6).
NOISE = (
    "litlogger",
    "LeafSpec",
    "configure_callbacks",
    "was configured so",
    "TPU available",
    "Previous log files in this directory will be deleted",
    "RotaryEmbedding",
    "v_num",
)


def train(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    # A plug-in that imports Lightning before Hydra configures logging: train.log stayed empty then.
    plugin = folder.parent / "early_lightning.py"
    plugin.write_text("import lightning.pytorch  # noqa: F401\n")
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONWARNINGS": "default"}
    return subprocess.run(
        [sys.executable, "-m", "grpo_lightning.train", *ARGS, f"plugins=[{plugin}]", f"hydra.run.dir={folder}", *extra],
        cwd=folder.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_reports_itself_on_a_quiet_console_and_resumes_into_the_same_csv(tmp_path):
    run = tmp_path / "run"
    first = train(run)
    assert first.returncode == 0, first.stderr[-3000:]
    console = first.stdout + first.stderr
    for noise in NOISE:
        assert noise not in console, noise
    # What matters stays: the health alert (this tiny run never gets an exact answer), the bar's metrics.
    assert "[grpo_lightning health]" in first.stderr
    assert "reward=" in first.stdout and "kl=" in first.stdout and "acc=" in first.stdout
    # Every line once: Lightning's own stderr handler no longer doubles Hydra's.
    assert console.count("`Trainer.fit` stopped") == 1
    tail = first.stdout.strip().splitlines()[-8:]
    named = {line.split()[0]: line.split()[-1] for line in tail if line.startswith("  ")}
    assert {"report", "summary", "samples", "model", "checkpoint", "metrics", "log"} <= set(named)
    assert named["model"].endswith("hf/final")
    for path in named.values():
        assert Path(path).exists(), path
    assert (run / "train.log").read_text().count("`Trainer.fit` stopped") == 1

    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 4 and summary["generation_batches"] == 4
    assert summary["num_tokens"] > 0 and summary["wall_seconds"] > 0
    assert {"reward/mean", "kl/mean", "val/accuracy", "completions/max_length"} <= set(summary["final"])
    assert summary["best"]["val/accuracy"]["step"] in (0, 4)
    assert all({"check", "step", "evidence"} <= set(a) for a in summary["alerts"])
    samples = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 and {s["step"] for s in samples} == {0, 2}  # batches 0 and 2, 4 rows each
    assert set(samples[0]["rewards"]) == {"arithmetic_exact", "arithmetic_close"}
    assert {"prompt", "completion", "reward", "advantage"} <= set(samples[0])
    assert (run / "report.png").read_bytes()[:4] == b"\x89PNG"

    resumed = train(run, "trainer.max_steps=6", "trainer.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.name for p in (run / "csv").iterdir()] == ["version_0"]
    with open(run / "csv" / "version_0" / "metrics.csv") as handle:
        table = list(csv.DictReader(handle))
    # One row per step with all its columns: the step's own metrics, the health monitor's and the
    # validation that followed it (before training, at the end of each fit) in the same row.
    assert [int(r["step"]) for r in table] == [0, 1, 2, 3, 4, 5, 6]
    assert [int(r["step"]) for r in table if r["val/accuracy"]] == [0, 4, 6]
    rows = [r for r in table if r.get("reward/mean")]
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["health/alert/diversity"] and r["train/loss"] for r in rows)
    lrs = [float(r["train/lr"]) for r in rows[:3]]
    assert lrs == pytest.approx([1e-4, 2e-4, 3e-4])  # algorithm.lr=3e-4 (tiny model) after 1/3, 2/3 warm-up
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["generation_batches"] == 6  # the history came back with the checkpoint
