"""The fault matrix (issue 27): a run hit by SIGKILL, one SIGTERM, two SIGTERMs, a full disk at a
checkpoint write, or a corrupt newest checkpoint, then resumed with ``trainer.resume=auto`` from
what is left, ends with weights bit-identical to one uninterrupted run of the same steps.

Real signals need a real process (the CLI in a subprocess); the rest run the CLI in this process
(``train.cli``), which is faster. One uninterrupted reference run serves the whole matrix.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
from safetensors.torch import load_file

from grpo_lightning import train

HOLD_REWARD = '''
import time
from pathlib import Path

from grpo_lightning.rewards import register_reward


@register_reward("fault_hold")
def fault_hold(prompts, completions, **kwargs):
    """Always 0.0; blocks while the file ``hold`` exists, so a signal can land inside a step."""
    if Path("hold").exists():
        Path("holding").touch()
        deadline = time.monotonic() + 60
        while Path("hold").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return [0.0] * len(completions)
'''

ARGS = [
    "plugins=[fault_hold.py]",
    "+task.rewards={arithmetic_exact: 0.5, arithmetic_close: 0.5, fault_hold: 1.0}",
    "rollout.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_new_tokens=4",
    "algorithm.micro_batch_size=auto",
    "trainer.max_steps=6",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.keep_checkpoints=3",
    "eval.before_training=false",
    "eval.num_prompts=2",
    "logger=none",
]


def cli_in_process(folder: Path, run: str, *extra: str, code: int = 0) -> None:
    """``grpo-lightning ARGS *extra`` in this process, in ``folder/run``; it must end with ``code``."""
    argv, cwd = sys.argv, os.getcwd()
    sys.argv = ["grpo-lightning", *ARGS, *extra, f"hydra.run.dir={folder / run}"]
    os.chdir(folder)
    try:
        train.cli()
        ended = 0
    except SystemExit as stop:
        ended = stop.code
    finally:
        sys.argv = argv
        os.chdir(cwd)
    assert ended == code


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), f"{path} never appeared"


def checkpoint(folder: Path, run: str, step: int) -> Path:
    return folder / run / "checkpoints" / f"step_{step:08d}.ckpt"


def resumed_matches_reference(folder: Path, run: str, reference: dict) -> None:
    cli_in_process(folder, run, "trainer.resume=auto")
    weights = load_file(folder / run / "hf" / "final" / "model.safetensors")
    assert weights.keys() == reference.keys()
    assert all((weights[k] == reference[k]).all() for k in reference), f"{run}: not bit-identical"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """The folder of every case, and the weights of one uninterrupted run."""
    folder = tmp_path_factory.mktemp("matrix")
    (folder / "fault_hold.py").write_text(HOLD_REWARD)
    cli_in_process(folder, "reference")
    return folder, load_file(folder / "reference" / "hf" / "final" / "model.safetensors")


def start_and_hold(folder: Path, run: str) -> subprocess.Popen:
    """The CLI in a subprocess, held inside the step after its first checkpoint (the reward blocks)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "grpo_lightning.train", *ARGS, f"hydra.run.dir={folder / run}"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(checkpoint(folder, run, 2), process)
    (folder / "hold").touch()
    wait_for(folder / "holding", process)
    return process


def release(folder: Path) -> None:
    (folder / "hold").unlink(missing_ok=True)
    (folder / "holding").unlink(missing_ok=True)


def wait_for_line(process: subprocess.Popen, text: str) -> None:
    line = process.stderr.readline()
    while line and text not in line:
        line = process.stderr.readline()
    assert text in line, f"the run never said {text!r}"


@pytest.mark.slow
def test_sigkill(matrix):
    folder, reference = matrix
    run = start_and_hold(folder, "sigkill")
    run.send_signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL
    release(folder)
    resumed_matches_reference(folder, "sigkill", reference)


@pytest.mark.slow
def test_sigterm_once(matrix):
    folder, reference = matrix
    run = start_and_hold(folder, "sigterm")
    run.send_signal(signal.SIGTERM)
    wait_for_line(run, "got SIGTERM")
    release(folder)  # the step finishes, then the run saves and stops
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err[-2000:]
    # The step that held is the one after the step-2 checkpoint, or one later on a loaded machine
    # (the hold file can come after that step's rewards were scored): the stop names the one it finished.
    stopped = re.search(r"stopped by SIGTERM after step (\d+)", err)
    assert stopped and int(stopped.group(1)) in (3, 4), err[-2000:]
    assert checkpoint(folder, "sigterm", int(stopped.group(1))).exists()
    resumed_matches_reference(folder, "sigterm", reference)


@pytest.mark.slow
def test_sigterm_twice_stops_inside_the_step(matrix):
    folder, reference = matrix
    run = start_and_hold(folder, "twice")
    try:
        run.send_signal(signal.SIGTERM)
        wait_for_line(run, "got SIGTERM")
        run.send_signal(signal.SIGTERM)  # still inside the step: stops now
        _, err = run.communicate(timeout=60)
    finally:
        release(folder)
    assert run.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "got SIGTERM again: stopping now" in err and "stopped by SIGTERM after step" not in err
    assert not checkpoint(folder, "twice", 3).exists()
    resumed_matches_reference(folder, "twice", reference)


def test_disk_full_at_a_checkpoint_write(matrix, monkeypatch, capsys):
    folder, reference = matrix
    real, calls = L.Trainer.save_checkpoint, []

    def save_checkpoint(self, filepath, *args, **kwargs):
        calls.append(filepath)
        if len(calls) == 2:  # step 4: half a file, then the disk is full
            Path(filepath).write_bytes(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filepath))
        return real(self, filepath, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "save_checkpoint", save_checkpoint)
    cli_in_process(folder, "disk_full", code=2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "Traceback" not in err[0]
    names = sorted(p.name for p in (folder / "disk_full" / "checkpoints").iterdir())
    assert names == ["step_00000002.ckpt", "step_00000002.ckpt.sha256"]
    monkeypatch.undo()
    resumed_matches_reference(folder, "disk_full", reference)


def test_corrupt_newest_checkpoint(matrix, capsys):
    folder, reference = matrix
    shutil.copytree(folder / "reference" / "checkpoints", folder / "corrupt" / "checkpoints")
    newest = checkpoint(folder, "corrupt", 6)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    resumed_matches_reference(folder, "corrupt", reference)
    err = capsys.readouterr().err
    assert f"skipping corrupt checkpoint {newest}" in err
    assert f"resuming from {checkpoint(folder, 'corrupt', 4)}" in err
