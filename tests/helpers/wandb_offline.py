"""Read an offline wandb run folder back: history rows, config, and logged table files.

The ``.wandb`` file is a LevelDB-style log (32 KiB blocks of 7-byte-headed chunks) of
``wandb_internal_pb2.Record`` protobufs, after a 7-byte file header; this reads it with
wandb's own protobuf definitions.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[pb.Record]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb log file"
    out, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:
            pos += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            break
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        elif kind == LAST:
            pending += chunk
        record = pb.Record()
        record.ParseFromString(pending)
        out.append(record)
        pending = b""
    return out


def history(run_dir: Path) -> list[dict]:
    """Every logged history row as {key: value} (values decoded from JSON)."""
    files = list(Path(run_dir).glob("*.wandb"))
    assert len(files) == 1, files
    rows = []
    for record in records(files[0]):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows


def config(run_dir: Path) -> dict:
    """The run config as logged (the last value of each key wins)."""
    files = list(Path(run_dir).glob("*.wandb"))
    result = {}
    for record in records(files[0]):
        if record.WhichOneof("record_type") == "config":
            for item in record.config.update:
                key = item.key or "/".join(item.nested_key)
                result[key] = json.loads(item.value_json)
    return result
