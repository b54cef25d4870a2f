"""What the vLLM server's processes import from this package: the weight receiver that vLLM's worker
loads (``--worker-extension-cls``) and the launcher, without Lightning (seconds of start-up each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: seconds
def test_the_vllm_worker_extension_and_launcher_import_without_lightning():
    code = (
        "import sys\n"
        "import grpo_lightning.rollout.transports.network_receiver, grpo_lightning.rollout.vllm_server_process\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", result.stdout
