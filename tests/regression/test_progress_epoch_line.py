"""The console showed Lightning's "Epoch 0" bar line once before ours: its TQDMProgressBar names the
bar per epoch when the epoch starts, and each refresh off a terminal is a line. A short CLI run, in
this process, prints our "train" bar and no "Epoch" line."""

from __future__ import annotations

import sys

import pytest

from grpo_lightning import train


@pytest.mark.slow
def test_the_console_has_our_bar_and_no_epoch_line(monkeypatch, tmp_path, capsys):
    args = ["trainer.max_steps=1", "rollout.prompts_per_step=2", "logger=none", "trainer.checkpoint_every_n_steps=0"]
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args, f"hydra.run.dir={tmp_path}/run"])
    train.cli()
    out = capsys.readouterr()
    lines = (out.out + out.err).replace("\r", "\n").splitlines()
    assert any(line.startswith("train: 100%") and "reward=" in line for line in lines), lines
    assert not [line for line in lines if "Epoch" in line or line.startswith("Training")]
    assert "final metrics" in out.out
