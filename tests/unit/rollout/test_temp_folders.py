"""Owned temporary folders (rollout/temp_folders.py): the IPC socket folder exists only where a
socket path in it fits AF_UNIX's limit, and then holds a socket vLLM's way."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid

from grpo_lightning.rollout.temp_folders import SOCKET_PATH_MAX, owned_socket_dir


def test_a_socket_folder_only_where_a_uuid_socket_path_fits(monkeypatch):
    root = tempfile.mkdtemp(prefix="s-")
    made = fell_back = 0
    for depth in range(0, 12):
        base = os.path.join(root, *(["d" * 8] * depth))
        os.makedirs(base, exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", base)
        folder = owned_socket_dir("vllm-ipc")
        kinds = [name for name in os.listdir(base) if name.startswith("grpo-vllm-ipc-")]
        if folder is None:  # too long: nothing made, nothing left behind
            assert kinds == []
            fell_back += 1
            continue
        made += 1
        path = os.path.join(folder.name, str(uuid.uuid4()))  # vLLM's ipc://<base>/<uuid4>
        assert len(path) <= SOCKET_PATH_MAX
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
        folder.cleanup()
        assert not os.path.exists(folder.name)
    monkeypatch.undo()
    shutil.rmtree(root)
    assert made and fell_back  # short and long temp folders both seen
