"""How the CLI ends: what the user can fix in one or two lines and exit 2, a stop by design in
exit 3, an internal bug with its traceback; ``--debug`` shows every traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from grpo_lightning import build, train
from grpo_lightning.config import ConfigError
from grpo_lightning.step.guards import NonFiniteTrainingError


def cli(monkeypatch, tmp_path, *args: str) -> None:
    """``grpo-lightning *args`` in this process, its Hydra output under ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args, f"hydra.run.dir={tmp_path}/run"])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    train.cli()


def ends_with(code: int, monkeypatch, tmp_path, capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        cli(monkeypatch, tmp_path, *args)
    err = capsys.readouterr().err
    assert stop.value.code == code, err
    assert "Traceback" not in err and "Error executing job" not in err, err
    assert 1 <= len(err.strip().splitlines()) <= 2, err
    assert "HYDRA_FULL_ERROR" not in os.environ  # restored: a launched server must not inherit it
    return err


def test_a_config_error_is_short_with_exit_2(monkeypatch, tmp_path, capsys):
    err = ends_with(2, monkeypatch, tmp_path, capsys, "algorithm.beta=-1")
    assert err.startswith("error: invalid config:") and "algorithm.beta=-1.0 must be >= 0" in err


def test_a_data_error_is_short_with_exit_2(monkeypatch, tmp_path, capsys):
    args = ("task=dataset", "task.path=missing.jsonl", "+task.rewards={arithmetic_exact: 1}")
    err = ends_with(2, monkeypatch, tmp_path, capsys, *args)
    assert err.strip() == "error: task.path='missing.jsonl': no such file or folder"


@pytest.mark.parametrize(
    "override, said",
    [
        ("algorithm.no_such_key=1", "algorithm.no_such_key is not a config field"),
        ("algorithm.beta=abc", "'abc' of type 'str' could not be converted to Float"),
        ("task=no_such_task", "is not a registered task. Registered: ['arithmetic'"),
        ("algorithm.beta=[", "algorithm.beta=["),
    ],
)
def test_hydra_override_errors_are_short_with_exit_2(monkeypatch, tmp_path, capsys, override, said):
    err = ends_with(2, monkeypatch, tmp_path, capsys, override)
    assert err.startswith("error: ") and said in err, err


def test_a_stop_by_design_prints_its_diagnosis_with_exit_3(monkeypatch, tmp_path, capsys):
    def stops(*args, **kwargs):
        raise NonFiniteTrainingError("GRPO stopped at step 3: lower algorithm.lr")

    monkeypatch.setattr(build, "build_run", stops)
    err = ends_with(3, monkeypatch, tmp_path, capsys)
    assert err.strip() == "stopped: GRPO stopped at step 3: lower algorithm.lr"


def test_an_internal_bug_propagates_in_process(monkeypatch, tmp_path):
    def bug(*args, **kwargs):
        return 1 / 0

    monkeypatch.setattr(build, "load_policy", bug)
    with pytest.raises(ZeroDivisionError):
        cli(monkeypatch, tmp_path)


def test_debug_keeps_the_traceback_of_a_user_error(monkeypatch, tmp_path, capsys):
    with pytest.raises(ConfigError, match="algorithm.beta=-1.0 must be >= 0"):
        cli(monkeypatch, tmp_path, "algorithm.beta=-1", "--debug")
    assert "error:" not in capsys.readouterr().err


# A bug injected deep in the run (the training step, inside Lightning's fit loop), as a user runs it.
INJECTED_BUG = textwrap.dedent(
    """
    import sys
    from grpo_lightning import train
    from grpo_lightning.step import module

    def training_step(self, batch, batch_idx):
        raise ZeroDivisionError("an injected bug")

    module.GRPOModule.training_step = training_step
    sys.argv = ["grpo-lightning", *sys.argv[1:]]
    train.cli()
    """
)


@pytest.mark.slow
def test_an_injected_bug_keeps_its_traceback_in_a_real_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WANDB_API_KEY")}
    args = ["trainer.max_steps=1", "rollout.prompts_per_step=2", "algorithm.micro_batch_size=8", "logger=none"]
    result = subprocess.run(
        [sys.executable, "-c", INJECTED_BUG, *args, "eval.before_training=false", f"hydra.run.dir={tmp_path}/run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode not in (0, 2, 3), result.stderr[-3000:]
    assert "Traceback (most recent call last)" in result.stderr, result.stderr[-3000:]
    assert "in training_step" in result.stderr and "ZeroDivisionError: an injected bug" in result.stderr
