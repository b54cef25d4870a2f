"""Temporary folders for weight copies, named ``grpo-<kind>-pid<PID>-*`` after the process that owns them.

Why the PID: a trainer killed with SIGKILL runs no cleanup, and each copy of the policy can be
gigabytes. The next start of the same kind removes every such folder whose owner is dead.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (another user's counts: not ours to clean)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to clean
        return True
    return True


def remove_orphans(kind: str, root: str | None = None) -> list[Path]:
    """Remove the ``kind`` folders under ``root`` (the temp folder) whose owner process is dead."""
    owner = re.compile(rf"grpo-{re.escape(kind)}-pid(\d+)-")
    return remove_dead_owners(Path(root or tempfile.gettempdir()), f"grpo-{kind}-pid*-*", owner)


def remove_dead_owners(root: Path, glob: str, owner: re.Pattern) -> list[Path]:
    """Remove the folders under ``root`` matching ``glob`` whose name's owner pid (``owner``'s first
    group, matched from the start of the name) names no live process; returns them."""
    removed = []
    for path in root.glob(glob):
        match = owner.match(path.name)
        if match and path.is_dir() and not path.is_symlink() and not process_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def owned_temp_dir(kind: str) -> tempfile.TemporaryDirectory:
    """A temporary folder owned by this process, after removing the ``kind`` folders of dead owners."""
    remove_orphans(kind)
    return tempfile.TemporaryDirectory(prefix=f"grpo-{kind}-pid{os.getpid()}-")


SOCKET_PATH_MAX = 100  # AF_UNIX paths end at 107 bytes; vLLM's IPC socket names add a 36-character UUID


def holds_socket_names(folder: str | Path) -> bool:
    """Whether vLLM's IPC sockets (``<folder>/<uuid4>``) fit AF_UNIX's path limit in ``folder``."""
    return len(str(folder)) + 37 <= SOCKET_PATH_MAX


def owned_socket_dir(kind: str) -> tempfile.TemporaryDirectory | None:
    """An owned folder for vLLM's IPC sockets (``VLLM_RPC_BASE_PATH``), which vLLM leaves in the
    temp folder even after a clean shutdown; None where the path would make a socket name too
    long (the sockets then go to the temp folder, as without it)."""
    folder = owned_temp_dir(kind)
    if not holds_socket_names(folder.name):
        folder.cleanup()
        return None
    return folder
