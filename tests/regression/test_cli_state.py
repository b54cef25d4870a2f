"""Regression: one in-process CLI run's held-back overrides (``task.rewards={...}``) leaked into
every later composition in the same process (a notebook, the test suite): a later
``to_train_config`` applied the first run's reward dict to a different task."""

from __future__ import annotations

import sys

import pytest
from hydra import compose, initialize_config_dir

from grpo_lightning import train
from grpo_lightning.config.compose import CONF_DIR


def test_a_cli_runs_held_back_overrides_do_not_outlive_it(monkeypatch, tmp_path):
    def no_run(cfg, logged_config=None):
        raise SystemExit(0)  # composed and typed: enough for this test

    monkeypatch.setattr(train, "run", no_run)
    argv = ["grpo-lightning", "task.rewards={arithmetic_exact: 1.0}", f"hydra.run.dir={tmp_path}", "logger=csv"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        train.cli()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose("train", overrides=["task=gsm", f"trainer.output_dir={tmp_path}/unused"])
    assert dict(train.to_train_config(composed).task.rewards) == {
        "gsm_exact": 1.0,
        "answer_format": 0.2,
        "length_penalty": 0.2,
    }
