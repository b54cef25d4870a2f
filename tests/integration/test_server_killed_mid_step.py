"""A vLLM server killed mid-step (issue 27's fault matrix, without vLLM: a stand-in server,
``tests/helpers/fake_vllm_server.py``): the run stops with one line naming the server and exit 2, and its
checkpoints resume to weights bit-identical to an uninterrupted run's."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grpo_lightning import train

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "helpers" / "fake_vllm_server.py"
DIGITS = ROOT / "examples" / "plugins" / "digit_reward.py"
PER_STEP = 4  # completion requests per step: prompts_per_step * num_generations
ARGS = [
    f"plugins=[{DIGITS}]",
    "task.rewards={digits_only: 1.0}",  # varies over the stand-in's completions: the policy learns
    "rollout.engine=vllm",
    "rollout.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_new_tokens=4",
    "rollout.vllm.server.timeout_s=20",
    "algorithm.micro_batch_size=auto",
    "trainer.max_steps=6",
    "trainer.checkpoint_every_n_steps=2",
    "eval.before_training=false",
    "eval.num_prompts=0",
    "logger=none",
]


def start_server(folder: Path, die_after: int = 0) -> tuple[subprocess.Popen, str]:
    port_file = folder / f"port-{time.monotonic_ns()}"
    server = subprocess.Popen([sys.executable, str(FAKE), str(port_file), str(die_after)])
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        assert server.poll() is None and time.monotonic() < deadline, "the stand-in server did not start"
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port_file.read_text()}"


def cli(folder: Path, run: str, url: str, *extra: str) -> int:
    argv, cwd = sys.argv, os.getcwd()
    sys.argv = ["grpo-lightning", *ARGS, f"rollout.vllm.server.url={url}", *extra, f"hydra.run.dir={folder / run}"]
    os.chdir(folder)
    try:
        train.cli()
        return 0
    except SystemExit as stop:
        return stop.code
    finally:
        sys.argv = argv
        os.chdir(cwd)


def final_weights(folder: Path, run: str) -> dict:
    return load_file(folder / run / "hf" / "final" / "model.safetensors")


def serve(folder: Path, run: str, *extra: str) -> int:
    """``cli`` against a healthy stand-in server, stopped after."""
    server, url = start_server(folder)
    try:
        return cli(folder, run, url, *extra)
    finally:
        server.kill()
        server.wait()


def same(weights: dict, reference: dict) -> bool:
    return weights.keys() == reference.keys() and all((weights[k] == reference[k]).all() for k in reference)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """An uninterrupted run's final weights, and a run whose server was SIGKILLed inside step 4:
    its exit code, stderr and time to stop."""
    folder = tmp_path_factory.mktemp("server-killed")
    assert serve(folder, "reference") == 0
    dying, url = start_server(folder, die_after=3 * PER_STEP + 1)  # inside step 4, after checkpoint 2
    try:
        with capture_stderr() as err:
            start = time.perf_counter()
            code = cli(folder, "killed", url)
            stopped_in = time.perf_counter() - start
    finally:
        dying.kill()
        dying.wait()
    assert dying.returncode == -signal.SIGKILL  # it died by itself, mid-step
    return folder, final_weights(folder, "reference"), code, err.getvalue(), stopped_in, url


@contextlib.contextmanager
def capture_stderr():
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        yield buffer


def test_a_server_killed_mid_step_stops_the_run_with_one_line_and_exit_2(killed):
    folder, _, code, err, stopped_in, url = killed
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and url in errors[0], errors
    assert "Traceback" not in err
    assert stopped_in < 60  # rollout.vllm.server.timeout_s=20 bounds it; a refused connection is at once
    checkpoints = sorted(p.name for p in (folder / "killed" / "checkpoints").glob("step_*.ckpt"))
    assert "step_00000002.ckpt" in checkpoints and checkpoints[-1] <= "step_00000003.ckpt", checkpoints


def test_the_last_scheduled_checkpoint_before_the_kill_resumes_bit_exactly(killed):
    folder, reference, *_ = killed
    shutil.copytree(folder / "killed", folder / "from_step_2")
    step_2 = folder / "from_step_2" / "checkpoints" / "step_00000002.ckpt"
    assert serve(folder, "from_step_2", f"trainer.resume={step_2}") == 0
    assert same(final_weights(folder, "from_step_2"), reference), "the resumed run is not bit-identical"


def test_resume_auto_after_the_kill_is_bit_exact(killed):
    """Regression: the checkpoint written when the error stopped step 3 counted that step's batch as
    begun, so the resumed run drew the next step's seeds and was not bit-identical."""
    folder, reference, *_ = killed
    shutil.copytree(folder / "killed", folder / "auto")
    assert serve(folder, "auto", "trainer.resume=auto") == 0
    assert same(final_weights(folder, "auto"), reference), "the resumed run is not bit-identical"
