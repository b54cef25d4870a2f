"""A run's output folder is private to its user (issue 46): checkpoints, completions.jsonl, the
exported model, the logs and the lock were written 0644 in 0755 folders, readable by every user
of the machine. Now folders are 0700 and files 0600, unless trainer.share_outputs=true."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from grpo_lightning import train
from grpo_lightning.runtime.run_lock import RunLock, release_all

pytestmark = pytest.mark.slow  # a whole (two-step) run of the CLI, in this process

ARGS = (
    "logger=csv",
    "trainer.max_steps=2",
    "trainer.checkpoint_every_n_steps=1",
    "rollout.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_new_tokens=3",
    "eval.num_prompts=2",
)


def run_cli(folder: Path, *extra: str) -> None:
    argv = sys.argv
    sys.argv = ["grpo-lightning", *ARGS, *extra, f"hydra.run.dir={folder}"]
    try:
        train.cli()
    except SystemExit as stop:
        assert stop.code in (0, None)
    finally:
        sys.argv = argv


def modes(folder: Path) -> dict[str, int]:
    everything = [folder, *folder.rglob("*")]
    return {str(p.relative_to(folder.parent)): stat.S_IMODE(p.stat().st_mode) for p in everything}


@pytest.fixture
def umask_022():
    release_all()  # runs an earlier test built and never fitted keep their private umask while held
    before = os.umask(0o022)  # what most systems give a user: 0755 folders, 0644 files
    yield
    os.umask(before)


def test_a_runs_output_is_private_to_its_user_and_the_umask_comes_back(tmp_path, umask_022):
    folder = tmp_path / "runs" / "a"
    run_cli(folder)
    found = modes(folder)
    names = {Path(p).name for p in found}
    assert {".run.lock", "config.yaml", "train.log", "completions.jsonl", "model.safetensors", "metrics.csv"} <= names
    assert any(p.endswith(".ckpt") for p in found) and any(p.endswith(".sha256") for p in found)
    for path, mode in found.items():
        expected = 0o700 if (folder.parent / path).is_dir() else 0o600
        assert mode == expected, f"{path} is {mode:o}, not {expected:o}"
    assert os.umask(0o022) == 0o022  # the process's umask is the user's again


def test_share_outputs_writes_with_the_users_umask(tmp_path, umask_022):
    folder = tmp_path / "shared"
    run_cli(folder, "trainer.share_outputs=true", "trainer.checkpoint_every_n_steps=0", "logger=none")
    found = modes(folder)
    assert found["shared"] == 0o755 and found["shared/.hydra/config.yaml"] == 0o644
    assert found["shared/completions.jsonl"] == found["shared/hf/final/config.json"] == 0o644
    assert found["shared/.run.lock"] == 0o600  # the lock is nobody else's business


def test_the_users_umask_comes_back_after_the_last_private_lock_in_any_order(tmp_path, umask_022):
    """Two runs held in one process (built in a notebook, one never fitted) released in the order
    they were taken left the second's saved umask, 077, as the process's (CI, 2026-12-02)."""
    for order in ((0, 1), (1, 0)):
        locks = [RunLock(tmp_path / f"{order}" / name).acquire(private=True) for name in ("a", "b")]
        assert os.umask(0o077) == 0o077
        locks[order[0]].release()
        assert os.umask(0o077) == 0o077  # one private run is still held
        locks[order[1]].release()
        assert os.umask(0o022) == 0o022
