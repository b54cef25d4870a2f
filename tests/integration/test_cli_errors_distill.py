"""The teacher's start-up refusals from the command line: a teacher folder that does not exist, a teacher of
another tokenizer, a teacher whose context is shorter than the rollout, a text teacher for a vision-language
student. Each: exit 2, the problem in one line
(a config error's one line under "invalid config:"), before anything trains."""

from __future__ import annotations

import sys

import pytest

from grpo_lightning import train
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy


def save_teacher(folder, alphabet=None, context=128) -> str:
    tokenizer = build_char_tokenizer(alphabet) if alphabet else build_char_tokenizer()
    build_tiny_policy(tokenizer, max_position_embeddings=context).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def refused(monkeypatch, tmp_path, capsys, teacher: str, *extra: str) -> str:
    monkeypatch.chdir(tmp_path)
    args = [f"algorithm.teacher.path={teacher}", "logger=csv", "trainer.max_steps=2", f"hydra.run.dir={tmp_path}/run"]
    args += extra
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    capsys.readouterr()  # what saving the teacher printed
    with pytest.raises(SystemExit) as stop:
        train.cli()
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert not list(tmp_path.glob("run/csv/*/metrics.csv"))  # nothing trained
    return err.strip().splitlines()[-1]


def test_a_teacher_folder_that_does_not_exist(monkeypatch, tmp_path, capsys):
    line = refused(monkeypatch, tmp_path, capsys, str(tmp_path / "no_teacher"))
    assert "algorithm.teacher.path=" in line and "no_teacher': no such folder" in line


def test_a_teacher_of_another_tokenizer(monkeypatch, tmp_path, capsys):
    line = refused(monkeypatch, tmp_path, capsys, save_teacher(tmp_path / "t", alphabet="0123456789+-=? "))
    assert line.startswith("error: the teacher's tokenizer") and "the student's token '*' is id 15" in line


def test_a_teacher_with_a_shorter_context(monkeypatch, tmp_path, capsys):
    line = refused(monkeypatch, tmp_path, capsys, save_teacher(tmp_path / "t", context=6))
    assert line.startswith("error: the teacher's context is 6 tokens")


def test_a_text_teacher_for_a_vision_language_student(monkeypatch, tmp_path, capsys):
    extra = ("model=tiny_vlm", "task=shapes", "task.size=24", "rollout.prompts_per_step=4")  # the check: after the data
    line = refused(monkeypatch, tmp_path, capsys, save_teacher(tmp_path / "t"), *extra)
    assert line.startswith("error: algorithm.teacher.path=") and "is a text-only model (llama)" in line
    assert "use a vision-language teacher of the student's family" in line
