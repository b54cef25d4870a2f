"""Two "nodes" on this machine: two processes started as a cluster launcher would (torchrun /
SLURM set the same variables), num_nodes=2, a loopback rendezvous, each with its own working
folder (no shared file system). Both join one DDP job, end with the same weights, and only the
first node's folder holds the checkpoints and the export (docs/scaling.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "two_node_worker.py"


@pytest.mark.slow
def test_two_nodes_train_one_job_each_in_its_own_folder(tmp_path):
    port, steps = free_port(), 2
    folders = [tmp_path / f"node{n}" for n in (0, 1)]
    nodes = []
    for node, folder in enumerate(folders):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(node)}
        env |= {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}
        command = [sys.executable, str(WORKER), str(folder), str(steps)]
        nodes.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True))
    try:
        errors = [node.communicate(timeout=240)[1] for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            os.killpg(node.pid, signal.SIGKILL)
        pytest.fail("the two-node run hung (a rank waits in a collective)")
    for node, err in zip(nodes, errors, strict=True):
        assert node.returncode == 0, err[-3000:]
    reports = [json.loads((folder / "rank.json").read_text()) for folder in folders]
    assert [(r["global_rank"], r["node_rank"], r["world_size"]) for r in reports] == [(0, 0, 2), (1, 1, 2)]
    assert reports[0]["global_step"] == reports[1]["global_step"] == steps
    assert reports[0]["checksum"] == reports[1]["checksum"]  # one DDP job: the same weights everywhere
    assert list((folders[0] / "checkpoints").glob("*.ckpt")) and (folders[0] / "hf" / "final").is_dir()
    assert not (folders[1] / "checkpoints").exists() or not list((folders[1] / "checkpoints").glob("*.ckpt"))
