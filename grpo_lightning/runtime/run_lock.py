"""One run per output folder: global rank 0 holds ``fcntl.flock`` on ``<output_dir>/.run.lock``.

Two runs writing the same checkpoints and ``hf/`` folders clobber each other, so a second run
fails at once, naming the first's PID and host (the lock file holds them). The kernel releases
a flock when its process dies, so a lock left by a killed run is simply taken over. Only global
rank 0 takes it (the other ranks of the same run would otherwise fight over it); ranks are read
from the launcher's environment because the lock is taken before Lightning starts. A flock is
per machine on most network file systems: it guards one host's runs, not two hosts sharing NFS.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

from grpo_lightning.errors import UserError

LOCK_NAME = ".run.lock"
_RANK_VARS = ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK")
_held: dict[Path, RunLock] = {}  # this process's locks: a later run of the same process takes them over


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

    def acquire(self) -> RunLock:
        previous = _held.pop(self.path, None)
        if previous is not None:  # a run of this process built earlier (a notebook): runs one after another
            previous.release()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # the file stays (unlinking a flock file races); empty means free
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        if _held.get(self.path) is self:
            del _held[self.path]


def lock_run_folder(folder: str | Path) -> RunLock | None:
    """Take the run folder's lock on global rank 0 (None on the other ranks)."""
    return RunLock(folder).acquire() if is_global_rank_zero() else None


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
