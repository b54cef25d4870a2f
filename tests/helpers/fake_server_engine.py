"""A :class:`VLLMServerEngine` connected to tests/helpers/fake_vllm_server.py in a subprocess (no vLLM)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

from grpo_lightning.config import VLLMConfig, VLLMServerConfig, VLLMSyncConfig
from grpo_lightning.rollout.vllm_server import VLLMServerEngine

FAKE = Path(__file__).resolve().parent / "fake_vllm_server.py"


class FakeServers:
    """Starts fake servers and engines on them; ``close`` stops them all."""

    def __init__(self, folder: Path):
        self.folder, self.started = folder, []

    def start(self, reload: str = "ok", lora=None, **sync) -> tuple[VLLMServerEngine, subprocess.Popen]:
        port_file = self.folder / f"port-{len(self.started)}"
        process = subprocess.Popen([sys.executable, str(FAKE), str(port_file), "0", reload])
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        config = VLLMConfig(server=VLLMServerConfig(url=url, timeout_s=10.0), sync=VLLMSyncConfig(**sync))
        engine = VLLMServerEngine.from_policy(None, SimpleNamespace(eos_token_id=0), config, seed=0, lora=lora)
        self.started.append((process, engine))
        return engine, process

    def close(self) -> None:
        for process, engine in self.started:
            engine.close()
            process.kill()
            process.wait()


def held(engine) -> dict:
    """The fake's ``/weight_info``: the version it reports, reloads and loaded adapters."""
    return httpx.get(f"{engine.client.url}/weight_info", timeout=5).json()
