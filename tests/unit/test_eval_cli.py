"""grpo-lightning-eval: what eval.checkpoint may name, the errors for what it may not, the table."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.errors import CheckpointError
from grpo_lightning.eval_cli import resolve, table


def test_a_checkpoint_path_resolves_to_an_hf_folder_or_a_ckpt(tmp_path):
    (tmp_path / "hf" / "final").mkdir(parents=True)
    (tmp_path / "hf" / "final" / "config.json").write_text("{}")
    assert resolve(str(tmp_path)) == ("hf", tmp_path / "hf" / "final")
    assert resolve(str(tmp_path / "hf" / "final")) == ("hf", tmp_path / "hf" / "final")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for step in (2, 10):
        torch.save({"state_dict": {}}, run / "checkpoints" / f"step_{step}.ckpt")
    assert resolve(str(run)) == ("ckpt", run / "checkpoints" / "step_10.ckpt")
    assert resolve(str(run / "checkpoints" / "step_2.ckpt")) == ("ckpt", run / "checkpoints" / "step_2.ckpt")


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: None, "needs eval.checkpoint=PATH"),
        (lambda p: str(p / "nope"), "does not exist"),
        (lambda p: str(p), "holds no model"),
        (lambda p: (p / "x.ckpt").write_text("not a zip") and str(p / "x.ckpt"), "is not a checkpoint"),
    ],
)
def test_a_missing_or_bad_checkpoint_is_one_user_error_naming_the_field(tmp_path, make, expected):
    with pytest.raises(CheckpointError, match=expected) as err:
        resolve(make(tmp_path))
    assert "eval.checkpoint" in str(err.value) and "hf/final" in str(err.value)


def test_the_table_has_a_row_per_source_and_one_for_all():
    metrics = {"val/accuracy": 0.5, "val/pass@4": 0.75, "val/prompts": 4, "val/a/accuracy": 1.0, "val/a/prompts": 2}
    metrics |= {"val/b/accuracy": 0.0, "val/b/prompts": 2, "val/a/pass@4": 1.0, "val/b/pass@4": 0.5}
    lines = table(metrics).splitlines()
    assert lines[0].split() == ["source", "prompts", "accuracy", "pass@4"]
    assert [line.split()[0] for line in lines[1:]] == ["a", "b", "all"]
    assert lines[3].split() == ["all", "4", "0.5000", "0.7500"]


def test_the_table_of_an_episode_task_has_its_episode_columns_and_stop_reasons():
    metrics = {"val/reward": 0.5, "val/success": 0.25, "val/turns": 3.5, "val/tool_calls": 1.0, "val/prompts": 8}
    metrics |= {"val/stop/done": 0.75, "val/stop/max_turns": 0.25, "val/stop/context": 0.0, "val/pass@4": 0.5}
    lines = table(metrics).splitlines()
    assert lines[0].split() == ["source", "prompts", "reward", "success", "pass@4", "turns", "tool_calls"]
    assert [line.split()[0] for line in lines[1:]] == ["all", "stop"]  # no source named "stop"
    assert lines[2] == "stop reasons: done 75%, max_turns 25%"
