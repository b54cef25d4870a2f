"""TRL-style reward functions, unchanged, train for 2 steps from the CLI and from Python (issue 28).

The functions (tests/helpers/trl_style_rewards.py) are plain, undecorated, named in task.rewards
through task.reward_modules, and assert inside that every column value belongs to its prompt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.trl_sums import write_sums

from grpo_lightning import train
from grpo_lightning.build import build_run
from grpo_lightning.config import RolloutConfig, TrainConfig, TrainerConfig
from grpo_lightning.registry import plugin_module
from grpo_lightning.tasks.dataset import DatasetTaskConfig

pytestmark = pytest.mark.slow

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
TRL_FILE = str(HELPERS / "trl_style_rewards.py")
WEIGHTS = {
    "reward_len": 0.1,
    "format_reward": 1.0,
    "accuracy": 1.0,
    "conversational_reward": 0.5,
    "async_reward": 0.5,
    "sometimes_none": 1.0,
    "overlong": 1.0,
}


def calls() -> dict[str, int]:
    return dict(plugin_module(TRL_FILE, "task.reward_modules").CALLS)


def test_trl_style_rewards_train_from_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = calls()
    rewards = "{" + ", ".join(f"{k}: {v}" for k, v in WEIGHTS.items()) + "}"
    args = [
        "task=dataset",
        f"task.path={write_sums(tmp_path)}",
        f"task.reward_modules=[{TRL_FILE}]",
        f"task.rewards={rewards}",
        "task.correctness_reward=accuracy",
        "rollout.prompts_per_step=2",
        "rollout.num_generations=4",
        "rollout.max_new_tokens=4",
        "rollout.dynamic_sampling=true",
        "trainer.max_steps=2",
        "eval.before_training=false",
        "logger=none",
        f"trainer.output_dir={tmp_path}/out",
        f"hydra.run.dir={tmp_path}/run",
    ]
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args])
    train.cli()
    out = capsys.readouterr().out
    assert "final metrics" in out and "reward/accuracy/mean" in out
    after = calls()
    assert all(after.get(name, 0) >= before.get(name, 0) + 2 for name in WEIGHTS if name != "overlong"), after


def test_trl_style_rewards_train_from_python(tmp_path):
    before = calls()
    cfg = TrainConfig(
        task=DatasetTaskConfig(
            path=str(write_sums(tmp_path)),
            reward_modules=[TRL_FILE],
            rewards=dict(WEIGHTS),
            correctness_reward="accuracy",
            val_fraction=0.0,
        ),
        rollout=RolloutConfig(prompts_per_step=2, num_generations=4, max_new_tokens=4),
        trainer=TrainerConfig(max_steps=2, output_dir=str(tmp_path / "out")),
    )
    cfg.logger.kind = "none"
    cfg.eval.before_training = False
    run = build_run(cfg)
    run.trainer(cfg).fit(run.module, datamodule=run.datamodule)
    metrics = run.module.last_metrics
    assert {f"reward/{name}/mean" for name in WEIGHTS} <= set(metrics)
    assert metrics["reward/accuracy_calls"] == 1.0  # log_metric from inside the reward
    after = calls()
    assert all(after.get(name, 0) >= before.get(name, 0) + 2 for name in WEIGHTS if name != "overlong"), after


def test_trl_style_rewards_see_aligned_columns_on_two_ddp_ranks(ddp_fits):
    """2 steps on 2 gloo ranks with dynamic sampling: each rank scores its own shard of the prompts,
    repeated per group, and every reward asserts that each column value is its prompt's (a
    misaligned one fails the run). completions.jsonl has accuracy's log_extra column, each value
    beside its completion: the sum its prompt asks for."""
    folder = ddp_fits("trl_rewards")  # the session's DDP launch (tests/conftest.py) ran this scenario
    reports = [json.loads((folder / f"rank_{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["global_step"] == 2 and report["world_size"] == 2
        assert all(report["reward_calls"].get(name, 0) >= 2 for name in WEIGHTS if name != "overlong"), report
    shown = {p for report in reports for step in report["prompts"] for p in step}
    assert len(shown) >= 4  # the ranks scored different prompts
    rows = [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]
    assert rows and all(r["expected"] == str(sum(map(int, r["prompt"].rstrip("=").split("+")))) for r in rows)
