"""Issue 46: ``rewards.<source>.*`` overrides were refused by real runs ("rewards.code_tests.cpu_s
is not a config field", also rewards.judge.url) while ``--cfg job`` and ``help rewards`` accepted
them, so the judge and the reward model could not be configured from the command line at all.
Through the CLI's entry point, stopped where the run would load the model."""

from __future__ import annotations

import sys

import pytest

from grpo_lightning import build, train


class Stop(Exception):
    pass


def composed(monkeypatch, tmp_path, *args):
    """The config ``grpo-lightning *args`` would build its run from."""
    seen = {}

    def capture(cfg, **kwargs):
        seen["cfg"] = cfg
        raise Stop

    monkeypatch.setattr(build, "build_run", capture)
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", "logger=none", *args, f"hydra.run.dir={tmp_path}/run"])
    with pytest.raises((Stop, SystemExit)) as ended:
        train.cli()
    assert ended.type is Stop, f"the CLI refused {args}"
    return seen["cfg"]


def test_reward_source_options_reach_the_run(monkeypatch, tmp_path):
    cfg = composed(
        monkeypatch,
        tmp_path,
        "task=code",
        "rewards.code_tests.cpu_s=3",
        "rewards.code_tests.wall_s=2.5",
        "rewards.judge.url=http://127.0.0.1:8000/v1",
        "rewards.judge.model=judge",
        "rewards.reward_model.dtype=bfloat16",
    )
    assert cfg.rewards.code_tests.cpu_s == 3 and cfg.rewards.code_tests.wall_s == 2.5
    assert cfg.rewards.judge.url == "http://127.0.0.1:8000/v1" and cfg.rewards.judge.model == "judge"
    assert cfg.rewards.reward_model.dtype == "bfloat16"


def test_a_misspelt_source_option_names_the_closest(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", "rewards.code_tests.cpux=3", f"hydra.run.dir={tmp_path}/r"])
    with pytest.raises(SystemExit) as ended:
        train.cli()
    assert ended.value.code == 2
    assert (
        "rewards.code_tests.cpux is not a config field; did you mean rewards.code_tests.cpu_s?"
        in capsys.readouterr().err
    )
