"""A SHA-256 per checkpoint, in a sidecar ``step_N.ckpt.sha256`` (the ``sha256sum`` format, so
``sha256sum -c`` checks it by hand too), written before the checkpoint is renamed into place: a
checkpoint of ours always has one, and a flipped bit or a truncated copy no longer resumes silently.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SUFFIX = ".sha256"
_CHUNK = 1 << 22


def sidecar(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + SUFFIX)


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_checksum(staging: Path, target: Path) -> Path:
    """The checksum of ``staging`` (the bytes on disk) as ``target``'s sidecar, written atomically."""
    out = sidecar(target)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "w") as handle:
            handle.write(f"{digest(staging)}  {target.name}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def check(checkpoint: Path) -> str | None:
    """None when ``checkpoint`` matches its sidecar; ``"missing"`` without one (an older run);
    otherwise why it does not match."""
    expected = sidecar(checkpoint)
    if not expected.is_file():
        return "missing"
    want = expected.read_text().split()
    if not want or len(want[0]) != 64:
        return f"its checksum file {expected.name} is unreadable"
    if digest(checkpoint) != want[0]:
        return f"its SHA-256 does not match {expected.name} (the file is corrupt or was changed)"
    return None
