"""Issue 46: a reward function had no time limit by default (a 60 s sleep just waited, a hung one
waited forever). Now every run has one (task.reward_timeout_s, 600 s), enforced in the trainer's
own thread, and a function past it stops the run in one line naming it and the key."""

from __future__ import annotations

import sys
import time

import pytest

from grpo_lightning import train
from grpo_lightning.config import TrainConfig
from grpo_lightning.rewards import REWARD_FUNCTIONS, register_reward
from grpo_lightning.rewards.deadline import LimitedReward
from grpo_lightning.tasks.mixed import task_scorer


@register_reward("sleeps_an_hour")
def sleeps_an_hour(prompts, completions, **_):
    time.sleep(3600)
    return [0.0] * len(completions)


def test_every_run_limits_its_reward_functions_by_default():
    cfg = TrainConfig()
    assert cfg.task.reward_timeout_s == 600 and not cfg.task.reward_process
    cfg.task.rewards = {"sleeps_an_hour": 1.0, "code_tests": 1.0}
    scorer = task_scorer(cfg.task)
    limited = {r.name: r.fn for r in scorer.rewards}
    assert isinstance(limited["sleeps_an_hour"], LimitedReward) and limited["sleeps_an_hour"].seconds == 600
    assert limited["code_tests"] is REWARD_FUNCTIONS["code_tests"]  # a source bounds itself (wall_s, workers)


def test_a_hung_reward_stops_the_run_in_one_line_naming_it(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    args = [
        "task.rewards={sleeps_an_hour: 1.0}",
        "task.reward_timeout_s=1",
        "logger=none",
        "trainer.max_steps=2",
        "rollout.prompts_per_step=1",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=4",
        "eval.before_training=false",
        f"trainer.output_dir={tmp_path}/out",
        f"hydra.run.dir={tmp_path}/run",
    ]
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args])
    start = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        train.cli()
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "reward function 'sleeps_an_hour' ran past task.reward_timeout_s=1 s" in err
    assert time.monotonic() - start < 60
