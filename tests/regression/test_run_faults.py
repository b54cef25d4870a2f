"""Faults around a run's folder (issue 27, items 3, 8, 9, 10, disk full, changed config): each test
is the regression test of one silent failure, and fails on the code before its fix."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import lightning as L
import pytest
import torch

import grpo_lightning.algorithm.objective as objective_lib
import grpo_lightning.runtime.checkpoints as checkpointing
from grpo_lightning.build import build_run
from grpo_lightning.errors import CheckpointError, UserError
from grpo_lightning.runtime import checksums
from grpo_lightning.runtime.resume_check import CONFIG_KEY
from grpo_lightning.runtime.run_lock import RunFolderBusy, RunLock, lock_run_folder
from grpo_lightning.runtime.stop_signals import StopSignals
from grpo_lightning.step.guards import NonFiniteTrainingError
from tests.helpers.runs import train


def config(make_config, folder, steps=4, **overrides):
    return make_config(
        steps,
        **{
            "rollout.prompts_per_step": 2,
            "rollout.num_generations": 2,
            "rollout.max_new_tokens": 4,
            "algorithm.micro_batch_size": "auto",
            "trainer.checkpoint_every_n_steps": 2,
            "trainer.output_dir": str(folder),
            "eval.before_training": False,
            **overrides,
        },
    )


def flip_a_bit(path, at=-100):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- 3: checksums
def test_a_bit_flipped_newest_checkpoint_is_skipped_and_an_explicit_one_refused(tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    paths = []
    for step in (2, 4):
        path = folder / f"step_{step:08d}.ckpt"
        staging = folder / f".{path.name}.tmp"
        staging.write_bytes(os.urandom(4096))
        checksums.write_checksum(staging, path)
        os.replace(staging, path)
        paths.append(path)
    assert checkpointing.resume_path("auto", tmp_path) == paths[1]
    flip_a_bit(paths[1])
    capsys.readouterr()
    assert checkpointing.resume_path("auto", tmp_path) == paths[0]
    err = capsys.readouterr().err
    assert f"skipping corrupt checkpoint {paths[1]}" in err and len(err.strip().splitlines()) == 2
    with pytest.raises(CheckpointError, match=rf"checkpoint {paths[1]} is corrupt: its SHA-256 does not match"):
        checkpointing.resume_path(str(paths[1]), tmp_path)
    flip_a_bit(paths[0])
    with pytest.raises(CheckpointError, match="every checkpoint under .* is corrupt"):
        checkpointing.resume_path("auto", tmp_path)
    # an older run's checkpoint, without a checksum: resumed, with one line saying so
    checksums.sidecar(paths[0]).unlink()
    capsys.readouterr()
    assert checkpointing.resume_path(str(paths[0]), tmp_path) == paths[0]
    assert "has no checksum file" in capsys.readouterr().err


def test_checkpoints_carry_checksums_and_the_config_as_plain_data(tmp_path, config_factory):
    cfg = config(config_factory, tmp_path / "r", steps=4, **{"trainer.keep_checkpoints": 1})
    train(cfg)
    (only,) = checkpointing.checkpoints_in(tmp_path / "r")
    assert checksums.check(only) is None
    assert sorted(p.name for p in only.parent.iterdir()) == [only.name, only.name + ".sha256"]  # pruned pairs
    state = torch.load(only, weights_only=True)
    assert state[CONFIG_KEY]["rollout"]["num_generations"] == 2 and state[CONFIG_KEY]["trainer"]["seed"] == 0


# ----------------------------------------------------------------------------- 8: the run-folder lock
HOLD = "import sys, time; from grpo_lightning.runtime.run_lock import RunLock; RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"


def test_a_second_run_in_the_same_folder_fails_at_once_and_a_dead_ones_lock_is_taken_over(tmp_path, config_factory):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        with pytest.raises(RunFolderBusy, match=rf"PID {holder.pid} on host {socket.gethostname()}") as info:
            build_run(config(config_factory, tmp_path))
        assert time.monotonic() - start < 5 and isinstance(info.value, UserError)
        assert len(str(info.value).splitlines()) == 1
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = RunLock(tmp_path).acquire()  # the kernel released the dead run's flock
    lock.release()


def test_only_global_rank_zero_takes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert lock_run_folder(tmp_path) is None
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "1")
    assert lock_run_folder(tmp_path) is None
    monkeypatch.delenv("NODE_RANK")
    first = lock_run_folder(tmp_path)
    again = lock_run_folder(tmp_path)  # the same process builds its next run: takes its own lock over
    assert first is not None and again is not None
    again.release()


# ----------------------------------------------------------------------------- 9: a second signal
def test_a_second_sigterm_stops_at_once_with_a_non_zero_code(tmp_path, config_factory, capsys):
    class TerminateTwice(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    cfg = config(config_factory, tmp_path / "t", steps=4, **{"trainer.checkpoint_every_n_steps": 1})
    with pytest.raises(SystemExit) as info:
        train(cfg, TerminateTwice())
    assert info.value.code == 128 + signal.SIGTERM
    # the step in progress was not finished: no checkpoint or model of step 2
    assert [p.name for p in checkpointing.checkpoints_in(tmp_path / "t")] == ["step_00000001.ckpt"]
    assert not (tmp_path / "t" / "hf").exists()
    assert "got SIGTERM again: stopping now" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is previous


# ----------------------------------------------------------------------------- 10: NaN stop saves
def test_the_nan_stop_saves_the_last_good_weights_and_says_where(tmp_path, config_factory, monkeypatch):
    real_aggregate = objective_lib.aggregate
    kept = {}

    class NanFromStep2(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 2:
                kept.update({k: v.clone() for k, v in pl_module.policy.state_dict().items()})
                monkeypatch.setattr(objective_lib, "aggregate", lambda *a, **k: real_aggregate(*a, **k) * float("nan"))

    cfg = config(
        config_factory,
        tmp_path / "n",
        steps=6,
        **{"trainer.checkpoint_every_n_steps": 0, "algorithm.max_consecutive_skips": 2},
    )
    with pytest.raises(NonFiniteTrainingError) as info:
        train(cfg, NanFromStep2())
    saved = tmp_path / "n" / "checkpoints" / "step_00000002.ckpt"
    assert f"The last good weights are saved in {saved}" in str(info.value)
    state = torch.load(saved, weights_only=True)["state_dict"]
    weights = {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}
    assert weights.keys() == kept.keys()
    assert all(torch.equal(weights[k], kept[k]) for k in kept)
    assert checksums.check(saved) is None


# ----------------------------------------------------------------------------- disk full
def disk_full_at(calls: set[int]):
    """Trainer.save_checkpoint that writes half a file and fails with ENOSPC on the given calls."""
    real = L.Trainer.save_checkpoint
    count = [0]

    def save_checkpoint(self, filepath, *args, **kwargs):
        count[0] += 1
        if count[0] in calls:
            with open(filepath, "wb") as handle:
                handle.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filepath))
        return real(self, filepath, *args, **kwargs)

    return save_checkpoint


def test_disk_full_at_a_checkpoint_leaves_no_tmp_and_the_previous_checkpoint_intact(
    tmp_path, config_factory, monkeypatch
):
    monkeypatch.setattr(L.Trainer, "save_checkpoint", disk_full_at({2}))
    with pytest.raises(CheckpointError) as info:
        train(config(config_factory, tmp_path / "d", steps=6))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "step_00000004.ckpt: No space left on device" in message
    assert "the previous checkpoint" in message and "step_00000002.ckpt is intact" in message
    folder = tmp_path / "d" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000002.ckpt", "step_00000002.ckpt.sha256"]
    assert checksums.check(folder / "step_00000002.ckpt") is None


def test_a_failed_export_keeps_the_runs_last_checkpoint(tmp_path, config_factory, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpointing, "export_hf", no_space)
    cfg = config(config_factory, tmp_path / "e", steps=3, **{"trainer.checkpoint_every_n_steps": 0})
    with pytest.raises(CheckpointError, match=r"cannot write the model to .*hf/final: No space left on device") as info:
        train(cfg)
    saved = tmp_path / "e" / "checkpoints" / "step_00000003.ckpt"
    assert f"the run's checkpoint {saved} is intact" in str(info.value)
    assert checksums.check(saved) is None


# ----------------------------------------------------------------------------- changed config
def test_resume_with_a_config_that_breaks_exact_resume_is_refused(tmp_path, config_factory):
    folder = tmp_path / "c"
    train(config(config_factory, folder, steps=2))
    resume = {"trainer.resume": "auto"}
    changed = config(config_factory, folder, steps=3, **resume, **{"rollout.num_generations": 3, "trainer.seed": 5})
    with pytest.raises(CheckpointError) as info:
        train(changed)
    message = str(info.value)
    assert "rollout.num_generations: 2 -> 3" in message and "trainer.seed: 0 -> 5" in message
    assert "trainer.resume_allow_changes=true" in message and "algorithm" not in message
    with pytest.raises(CheckpointError, match=r"at step 2, past trainer.max_steps=1"):
        train(config(config_factory, folder, steps=1, **resume))
    allowed = config(
        config_factory, folder, steps=3, **resume, **{"trainer.seed": 5, "trainer.resume_allow_changes": True}
    )
    _, trainer = train(allowed)
    assert trainer.global_step == 3


def test_the_stop_is_agreed_by_all_ranks_at_the_step_boundary():
    """A signal that reached only another rank stops this one after the same step (an all-reduce max)."""

    def trainer(other_rank: int):
        reduce = lambda t, reduce_op: torch.maximum(t, torch.tensor(float(other_rank)))  # noqa: E731
        strategy = SimpleNamespace(root_device=torch.device("cpu"), reduce=reduce)
        return SimpleNamespace(world_size=2, strategy=strategy)

    here = StopSignals()
    assert here.agreed(trainer(0)) is None
    assert here.agreed(trainer(signal.SIGTERM)) == signal.SIGTERM
    here.received = signal.SIGINT
    assert here.agreed(trainer(0)) == signal.SIGINT
    assert here.agreed(SimpleNamespace(world_size=1)) == signal.SIGINT
