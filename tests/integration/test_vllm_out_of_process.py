"""The out-of-process engine (rollout.vllm.in_process=false): weights travel through a folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from grpo_lightning.config import RolloutConfig
from grpo_lightning.models import build_tiny_policy
from grpo_lightning.rollout import GenerationRequest, Sampling
from grpo_lightning.rollout.temp_folders import remove_orphans

HERE = Path(__file__).resolve().parents[1] / "helpers"


def _environment(private_tmp: Path) -> dict[str, str]:
    # A temp folder of its own (short: vLLM's socket paths must fit 107 bytes), so what the run
    # leaves there is its own.
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TMPDIR=str(private_tmp),
        PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )


@pytest.mark.slow
def test_out_of_process_engine_syncs_through_a_safetensors_folder(vllm_session):
    private_tmp = Path(tempfile.mkdtemp(prefix="oop-"))
    env = _environment(private_tmp)
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "vllm_out_of_process_check.py")],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        left = sorted(p.relative_to(private_tmp).as_posix() for p in private_tmp.rglob("*") if p.is_socket())
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["state_kept"]
    assert result["sockets_in_own_folder"] and left == []  # vLLM left 7 sockets in the temp folder before
    assert result["folder_used"] and result["sync_seconds"] > 0
    assert result["changed"]  # the folder sync is not a no-op ...
    assert result["probe_diff"] < 1e-4  # ... and the engine now scores like the trained policy
    # Same weights, same seeds: the out-of-process engine samples what the in-process one does.
    tok = vllm_session.tokenizer
    vllm_session.engine.load_weights(build_tiny_policy(tok).state_dict().items())
    requests = [GenerationRequest(tok("2+5=")["input_ids"], seed) for seed in (11, 12, 13)]
    in_process = vllm_session.engine.generate(
        requests, Sampling.from_config(RolloutConfig(max_new_tokens=6, temperature=1.0))
    )
    assert [c.token_ids for c in in_process] == result["before"]


@pytest.mark.slow
def test_a_sigkilled_trainer_leaves_no_engine_process_and_the_next_start_removes_its_folders():
    """vLLM's EngineCore and worker outlived a SIGKILLed trainer (reparented to init, holding the
    model and KV cache); the engine's watchdog now stops them, and the next start of each kind
    removes the dead trainer's folders (weights, sync, IPC sockets)."""
    private_tmp = Path(tempfile.mkdtemp(prefix="oop-"))
    try:
        trainer = subprocess.Popen(
            [sys.executable, str(HERE / "vllm_out_of_process_check.py"), "--wait-to-be-killed"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_environment(private_tmp),
        )
        line = next(line for line in trainer.stdout if line.startswith("RESULT "))
        started = json.loads(line[len("RESULT ") :])
        engine = [psutil.Process(pid) for pid in started["engine_pids"]]
        assert any("EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()) for p in engine), engine
        assert any(p.is_socket() for p in Path(started["socket_dir"]).iterdir())
        trainer.kill()
        trainer.wait(30)
        _, alive = psutil.wait_procs(engine, timeout=30)
        assert alive == []  # within the watchdog's grace, not left running
        kinds = ("vllm-model", "vllm-sync", "vllm-ipc")
        assert {p.name.split("-pid")[0] for p in private_tmp.iterdir()} <= {f"grpo-{k}" for k in kinds}
        for kind in kinds:  # what the next start of each kind runs first
            remove_orphans(kind, root=str(private_tmp))
        assert list(private_tmp.iterdir()) == []
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)
