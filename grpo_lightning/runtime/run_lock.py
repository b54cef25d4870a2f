"""One run per output folder: global rank 0 holds ``fcntl.flock`` on ``<output_dir>/.run.lock``.

Two runs writing the same checkpoints and ``hf/`` folders clobber each other, so a second run
fails at once, naming the first's PID and host (the lock file holds them). The kernel releases
a flock when its process dies, so a lock left by a killed run is simply taken over. Only global
rank 0 takes it (the other ranks of the same run would otherwise fight over it); ranks are read
from the launcher's environment because the lock is taken before Lightning starts. A flock is
per machine on most network file systems: it guards one host's runs, not two hosts sharing NFS.

Under the CLI the lock is taken by a Hydra callback (:class:`LockBeforeHydraWrites`, named in
``conf/train.yaml``) before Hydra writes ``.hydra/`` and ``train.log`` into the folder: a second
run refused by the lock must not have overwritten the live run's recorded config or its log.
``build_run`` then takes the same lock over from it, without a moment in which it is free.

While it holds the lock a run's output is private to its user (``trainer.share_outputs=false``,
the default): the process's umask is 077, so every folder it creates is 0700 and every file
0600 (checkpoints, ``completions.jsonl``, the exported model, logs, the lock), and the run
folder itself is made 0700 when it is the user's own. The umask comes back when the lock is
released; with several private locks in one process (runs built in a notebook and never fitted),
the user's umask is the one from before the first and comes back when the last is released, in
whatever order they are. ``trainer.share_outputs=true`` leaves the umask the user runs with.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from grpo_lightning.errors import UserError

LOCK_NAME = ".run.lock"
PRIVATE_UMASK = 0o077  # group and others get nothing
_RANK_VARS = ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK")
_held: dict[Path, RunLock] = {}  # this process's locks: a later run of the same process takes them over
_private: set[Path] = set()  # the held locks that keep the umask at PRIVATE_UMASK
_user_umask: list[int] = []  # the umask from before the first of them (empty while none is held)


class RunFolderBusy(UserError):
    """Another live run holds the output folder's lock."""


def is_global_rank_zero() -> bool:
    """Whether this process is the run's global rank 0, from the launcher's environment."""
    return all(os.environ.get(var, "0") in ("", "0") for var in _RANK_VARS)


class RunLock:
    """The lock on one run folder; :meth:`release` (or process exit) frees it."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder).resolve() / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, private: bool = False) -> RunLock:
        """Take the lock; ``private``: the run's output is its user's only (module docstring)."""
        previous = _held.pop(self.path, None)
        if previous is not None and previous._fd is not None:
            # This process holds it already (the CLI's Hydra callback, or a run built earlier in a notebook):
            # take the open lock over, so that no other process can slip in between.
            self._fd, previous._fd = previous._fd, None
            _held[self.path] = self
            self._privacy(private)
            return self
        self.path.parent.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read(fd)
            os.close(fd)
            raise RunFolderBusy(
                f"{self.path.parent} is in use by another run (PID {owner.get('pid', '?')} on host "
                f"{owner.get('host', '?')}): wait for it to end, or give this run its own trainer.output_dir "
                f"(hydra.run.dir under the CLI)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        self._fd = fd
        _held[self.path] = self
        self._privacy(private)
        return self

    def _privacy(self, private: bool) -> None:
        """Umask 077 while a private lock is held (the user's back after the last), the run folder 0700."""
        if private:
            _make_private(self.path)
        else:
            _end_private(self.path)
        folder = self.path.parent
        if private and folder.stat().st_uid == os.getuid() and folder not in (Path.cwd(), Path.home()):
            folder.chmod(folder.stat().st_mode & 0o700)

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # the file stays (unlinking a flock file races); empty means free
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        if _held.get(self.path) is self:
            del _held[self.path]
            _end_private(self.path)


def _make_private(path: Path) -> None:
    previous = os.umask(PRIVATE_UMASK)
    if not _private:
        _user_umask[:] = [previous]
    _private.add(path)


def _end_private(path: Path) -> None:
    if path in _private:
        _private.discard(path)
        if not _private:
            os.umask(_user_umask.pop())


def lock_run_folder(folder: str | Path, private: bool = False) -> RunLock | None:
    """Take the run folder's lock on global rank 0 (None on the other ranks); ``private``: see the module."""
    return RunLock(folder).acquire(private) if is_global_rank_zero() else None


def release_all() -> None:
    """Free every lock this process holds (the CLI, when its command line ends however it ends)."""
    for lock in list(_held.values()):
        lock.release()


class HydraCallbackRefused(BaseException):  # noqa: N818  (a carrier, not an error of its own)
    """Carries a :class:`UserError` out of a Hydra callback: Hydra turns an ``Exception`` raised there
    into a warning and goes on writing. The CLI re-raises :attr:`error` (``train._plan_then_main``)."""

    def __init__(self, error: UserError):
        super().__init__(str(error))
        self.error = error


class LockBeforeHydraWrites(Callback):
    """Hydra callback: lock ``hydra.run.dir`` before Hydra writes anything into it (module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Resolved on the config run_job reads it from: ${now:...} is cached there, so both name one folder.
        folder = os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir")))
        try:
            lock_run_folder(folder, private=not OmegaConf.select(config, "trainer.share_outputs", default=False))
        except UserError as err:
            raise HydraCallbackRefused(err) from None


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
