"""The worked examples of docs/extending.md run as the docs say: each plug-in file under
examples/plugins/ is passed to the CLI with plugins=[...], trains a couple of tiny steps, and
shows its effect in the logged metrics. Each run is its own process: a plug-in registers into the
process's registries for good, and the other tests of a worker must not see it.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_lightning.build import build_datamodule
from grpo_lightning.config.compose import compose

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "examples" / "plugins"
TINY = [
    "trainer.max_steps=2",
    "rollout.prompts_per_step=4",
    "rollout.num_generations=8",
    "eval.before_training=false",
    "eval.num_prompts=4",
    "logger=csv",
]


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "grpo_lightning.train", *args, f"hydra.run.dir={tmp_path}/run"],
        cwd=ROOT,  # the docs' commands name the examples relative to the repository root
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def train(tmp_path: Path, *args: str) -> list[dict[str, float]]:
    """Run the CLI; the logged training rows (one per step)."""
    result = cli(tmp_path, *TINY, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics,) = (tmp_path / "run").glob("csv/version_*/metrics.csv")
    with open(metrics) as handle:  # one row per step
        table = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]
    rows = [row for row in table if "reward/mean" in row]
    assert len(rows) == 2
    return rows


def test_the_reward_example_scores_the_run(tmp_path):
    rows = train(tmp_path, "plugins=[examples/plugins/digit_reward.py]", "task.rewards={digits_only: 1.0}")
    for row in rows:
        # It is the only reward, with weight 1: it is what the run was scored with.
        assert row["reward/digits_only/mean"] == pytest.approx(row["reward/mean"])
        assert 0.0 <= row["reward/mean"] <= 1.0
        assert "reward/arithmetic_exact/mean" not in row  # the task's own rewards were replaced


def test_the_task_example_brings_its_prompts_option_and_reward(tmp_path):
    plugin = f"plugins=[{PLUGINS / 'doubling_task.py'}]"
    cfg, _ = compose([plugin, "task=doubling", "task.max_value=5", f"trainer.output_dir={tmp_path}/unused"])
    cfg.rollout.prompts_per_step = 1
    prompts = [r["prompt"] for r in build_datamodule(cfg).train_records]
    assert prompts and all(re.fullmatch(r"[0-5]\*2=", p) for p in prompts)

    rows = train(tmp_path, "plugins=[examples/plugins/doubling_task.py]", "task=doubling", "task.max_value=20")
    assert all(row["reward/doubling_exact/mean"] == pytest.approx(row["reward/mean"]) for row in rows)

    typo = cli(tmp_path, "plugins=[examples/plugins/doubling_task.py]", "task=doubling", "task.max_valu=5")
    assert typo.returncode == 2 and "did you mean task.max_value" in typo.stderr, typo.stderr[-2000:]
    small = cli(tmp_path, "plugins=[examples/plugins/doubling_task.py]", "task=doubling", "task.max_value=2")
    assert small.returncode == 2 and "task.max_value=2 must be >= 4" in small.stderr, small.stderr[-2000:]


def test_the_loss_example_is_the_loss_the_run_trains_with(tmp_path):
    rows = train(
        tmp_path, "plugins=[examples/plugins/reinforce_loss.py]", "algorithm.policy_loss=reinforce", "algorithm.beta=0"
    )
    # GRPO's surrogate at ratio 1 (one pass, beta 0, seq_mean_token_mean) aggregates to exactly
    # mean(-A) = 0 (the F5 identity); REINFORCE's -A * log p does not, wherever a group has signal.
    informative = [row for row in rows if row["reward/frac_zero_std"] < 1.0]
    assert informative, "no group had reward variance: the test cannot tell the losses apart"
    assert all(abs(row["train/loss"]) > 1e-6 for row in informative)


def test_the_health_check_example_alerts_as_its_option_says(tmp_path):
    plugin = "plugins=[examples/plugins/long_completions_check.py]"
    rows = train(tmp_path, plugin, "health.long_completions.max_mean_tokens=0.5")
    for row in rows:
        assert row["health/long_completions/mean_tokens"] == pytest.approx(row["completions/mean_length"])
        assert row["health/alert/long_completions"] == 1.0  # every completion has at least one token
    quiet = train(tmp_path / "quiet", plugin, "health.long_completions.max_mean_tokens=1000")
    assert all(row["health/alert/long_completions"] == 0.0 for row in quiet)


def test_the_engine_example_samples_the_completions_trained_on(tmp_path):
    plugin = "plugins=[examples/plugins/uniform_engine.py]"
    first = train(tmp_path / "a", plugin, "rollout.engine=uniform_tokens")
    again = train(tmp_path / "b", plugin, "rollout.engine=uniform_tokens")
    # Seeded per request: the same run twice samples the same completions ...
    assert [r["completions/mean_length"] for r in first] == [r["completions/mean_length"] for r in again]
    # ... and the samples of a group differ (independent streams), so some groups carry signal.
    assert any(row["reward/frac_zero_std"] < 1.0 for row in first)
