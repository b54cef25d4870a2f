"""task=guess_number trains from the command line: episodes in an environment, their metrics logged."""

from __future__ import annotations

import csv
import logging
import sys

import pytest

from grpo_lightning import train

pytestmark = pytest.mark.slow  # a few seconds: a whole (short) run

ARGS = (  # README: `grpo-lightning task=guess_number` (its turn budget for the tiny model: 3 tokens)
    "task=guess_number",
    "logger=csv",
    "trainer.max_steps=2",
    "rollout.prompts_per_step=2",
    "rollout.num_generations=4",
)


def test_guess_number_trains_from_the_cli_and_logs_episode_metrics(tmp_path, monkeypatch, caplog, recwarn):
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *ARGS, f"hydra.run.dir={tmp_path}/run"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        train.cli()
    except SystemExit as stop:
        assert stop.code in (0, None)
    (file,) = (tmp_path / "run").rglob("metrics.csv")
    rows = [row for row in csv.DictReader(file.open()) if row.get("reward/mean")]
    assert len(rows) == 2
    for row in rows:
        assert float(row["rollout/episodes/count"]) == 8 and 1 <= float(row["rollout/episodes/turns"]) <= 6
        assert float(row["rollout/episodes/sampled_tokens"]) > 0 and float(row["rollout/episodes/env_tokens"]) >= 0
        stops = sum(float(row[f"rollout/episodes/stop/{reason}"]) for reason in ("done", "max_turns", "context"))
        assert stops == 8 and float(row["rollout/episodes/failed"]) == 0
        assert "health/episode_failures/failed_frac" in row
    # At start: the parser and the template's verdict, in the run's log (what a user reads later;
    # caplog misses them once an earlier in-process run configured logging).
    printed = (tmp_path / "run" / "train.log").read_text()
    assert "tool-call parser: none (the environment offers no tools" in printed
    assert "chat template: no tools offered" in printed and "rollout.max_new_tokens=3" in printed
    # none of the start-up warnings that do not apply to a game without tools on a template-less model
    assert [str(w.message) for w in recwarn if "grpo_lightning" in w.filename] == []
    # the held-out games, before training and after: the same 32 games (eval.num_prompts caps at 64)
    val = [row for row in csv.DictReader(file.open()) if row.get("val/reward")]
    assert len(val) == 2 and all(0 <= float(row["val/success"]) <= 1 for row in val)
