"""A launched vLLM server never outlives its trainer: SIGKILL the trainer and every process of the
server's group (the API server and vLLM's EngineCore, a separate process) is gone soon after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

TRAINER = """
import sys, time
from grpo_lightning.config import VLLMConfig, VLLMServerConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout.vllm_server import VLLMServer, VLLMServerEngine
tokenizer = build_char_tokenizer()
config = VLLMConfig(max_model_len=128, kv_cache_gib=0.5, server=VLLMServerConfig(launch=True, timeout_s=60))
if sys.argv[1] != "starting":
    server = VLLMServerEngine.from_policy(build_tiny_policy(tokenizer), tokenizer, config, seed=0).server
else:  # killed while the server is still starting
    server = VLLMServer(build_tiny_policy(tokenizer), tokenizer, config, seed=0)
print(server.process.pid, flush=True)
if sys.argv[1] == "raises":
    sys.stdin.readline()
    raise RuntimeError("a bug in the trainer")  # uncaught: the interpreter exits with code 1
time.sleep(600)
"""


def _group(pgid: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.Error):
            pass
    return members


# No SIGTERM case: this trainer has no handler, so SIGTERM ends it as SIGKILL does (no Python code runs)
# and its server sees the same parent death; the CLI's own SIGTERM handling is test_fault_matrix.py's.
@pytest.mark.parametrize(("when", "end"), [("starting", "SIGKILL"), ("serving", "SIGKILL"), ("raises", "exception")])
def test_a_dead_trainer_leaves_no_process_of_its_server_behind(when, end):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, when], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    guard = threading.Timer(240, trainer.kill)  # a launch that hangs must not hang the suite
    guard.start()
    try:
        server_pid = int(trainer.stdout.readline())
    finally:
        guard.cancel()
    try:
        deadline = time.monotonic() + 120
        while len(members := _group(server_pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the server runs in its own session: its group is its pid
        assert len(members) >= 2, [m.cmdline() for m in members]  # the API server and its EngineCore
        if end == "exception":
            trainer.stdin.write("go\n")
            trainer.stdin.flush()
            assert trainer.wait(timeout=60) == 1
        else:
            trainer.send_signal(getattr(signal, end))
            trainer.wait()
        deadline = time.monotonic() + 20
        while _group(server_pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _group(server_pid)
        assert not left, f"left behind: {[(m.pid, m.name()) for m in left]}"
    finally:
        for member in _group(server_pid):
            member.kill()
