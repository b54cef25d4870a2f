"""Server faults without vLLM: a dead server URL fails within its documented timeout, never later;
weight copies of a SIGKILLed trainer are removed at the next start; the launched server's
watchdog takes its whole process group down with the trainer."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_lightning.config import VLLMConfig, VLLMServerConfig
from grpo_lightning.errors import ServerError
from grpo_lightning.rollout.temp_folders import remove_orphans
from grpo_lightning.rollout.vllm_server import VLLMServerEngine

ROOT = Path(__file__).resolve().parents[2]


def _connect(url: str, timeout_s: float = 300.0) -> VLLMServerEngine:
    config = VLLMConfig(server=VLLMServerConfig(url=url, timeout_s=timeout_s))
    return VLLMServerEngine.from_policy(None, SimpleNamespace(eos_token_id=0), config, seed=0)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_refused_connection_fails_at_once_naming_the_url_even_with_the_default_timeout():
    url = f"http://127.0.0.1:{_closed_port()}"
    start = time.perf_counter()
    with pytest.raises(ServerError) as caught:
        _connect(url)  # timeout_s=300 (the default): waiting cannot make a closed port answer
    assert time.perf_counter() - start < 3.0
    message = str(caught.value)
    assert url in message and "rollout.vllm.server.url" in message and "\n" not in message


def test_a_server_that_accepts_but_never_answers_fails_within_timeout_s():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes connections; nobody ever reads or answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.perf_counter()
        with pytest.raises(ServerError) as caught:
            _connect(url, timeout_s=1.5)
        elapsed = time.perf_counter() - start
    assert 1.4 < elapsed < 3.5, elapsed
    assert url in str(caught.value) and "rollout.vllm.server.timeout_s=1.5" in str(caught.value)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_remove_orphans_removes_only_the_folders_of_dead_owners(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    for name in (f"grpo-vllm-sync-pid{dead}-a", f"grpo-vllm-sync-pid{alive}-b", f"grpo-vllm-model-pid{dead}-c", "x"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"0" * 10)
    removed = remove_orphans("vllm-sync", str(tmp_path))
    assert [p.name for p in removed] == [f"grpo-vllm-sync-pid{dead}-a"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f"grpo-vllm-sync-pid{alive}-b", f"grpo-vllm-model-pid{dead}-c", "x"])


KILLED_WRITER = """
import sys, time, torch
from grpo_lightning.rollout.temp_folders import owned_temp_dir
from grpo_lightning.rollout.transports.folder import save_weights_folder
folder = owned_temp_dir("vllm-sync")
save_weights_folder([("w", torch.ones(4))], folder.name)
print(folder.name, flush=True)
time.sleep(600)
"""


def test_weight_copies_of_a_sigkilled_trainer_are_removed_at_the_next_start(tmp_path, monkeypatch):
    """A process writes weights the way the folder transport does, is SIGKILLed (no cleanup runs),
    and the next engine's sync folder removes its copy."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER], stdout=subprocess.PIPE, text=True, env=env)
    left = Path(writer.stdout.readline().strip())
    writer.kill()
    writer.wait()
    assert (left / "model.safetensors").exists() and left.parent == tmp_path
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config = VLLMConfig(server=VLLMServerConfig(url="http://127.0.0.1:1"))
    engine = VLLMServerEngine(config, config.server.url)  # the next start: its own sync folder
    try:
        assert not left.exists()
        assert Path(engine.sync_folder()).name.startswith(f"grpo-vllm-sync-pid{os.getpid()}-")
    finally:
        engine.close()
    assert list(tmp_path.iterdir()) == []  # and its own goes at close


# server_auth.py runs as a script, stdlib only (the launch runs ``python -P server_auth.py``): loaded
# here by its path as well, not through grpo_lightning.rollout, whose imports (torch, transformers)
# took most of the 30 s below on a loaded machine.
SERVER = f"""
import importlib.util, os, signal, subprocess, sys, time
spec = importlib.util.spec_from_file_location("server_auth", {str(ROOT / "grpo_lightning" / "rollout" / "server_auth.py")!r})
server_auth = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server_auth)
server_auth._watch_trainer(os.getppid(), grace_s=2.0)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # like vLLM's EngineCore
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like a server still starting
time.sleep(600)
"""

TRAINER = f"""
import os, subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", {SERVER!r}], start_new_session=True)
print(server.pid, flush=True)
time.sleep(600)
"""


def _group(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the watchdog reads /proc (Linux)")
def test_the_server_watchdog_takes_the_whole_group_down_when_the_trainer_is_sigkilled():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True, env=env)
    server = int(trainer.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while len(_group(server)) < 3 and time.monotonic() < deadline:  # server, watchdog, "EngineCore"
            time.sleep(0.1)
        assert len(_group(server)) == 3
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 10
        while _group(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group(server) == []  # the server ignored SIGTERM: the watchdog's SIGKILL took it
    finally:
        for pid in _group(server):
            os.kill(pid, signal.SIGKILL)
