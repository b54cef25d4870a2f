"""Every script in benchmarks/ imports and runs: its smallest setting, for seconds, in this process.

A benchmark is run rarely and by hand, so a call it makes into the package can break for weeks
before anyone notices (lora_sync.py's weight sync did). Here each one runs its smallest setting
through its own ``main()`` (or its child's, for the scripts that run each measurement in a
fresh process) and the test checks what it printed or wrote. Where a real run needs TRL's venv
(``.venv-bench``, which CI does not build), a GPU, a vLLM engine or server, root, or minutes,
the script is asked for ``--help`` and the parts of it that run without those (its
configuration, its sync loop) are run on their own. Nothing here is a measurement.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import pytest

from grpo_lightning.config import ModelConfig
from grpo_lightning.models import load_policy
from tests.helpers.lying_engines import OwnWeightsEngine

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NAMES = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import each other by name (trl_vs_ours, memory, gpu_qwen2)

# The module-scoped fixture (the tiny model's folder) is cheap: each worker may make its own.
pytestmark = pytest.mark.spread_over_workers


def finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def result_line(printed: str) -> dict | list:
    """The JSON after ``RESULT `` on the last such line: what a benchmark's child hands its parent."""
    lines = [line for line in printed.splitlines() if line.startswith("RESULT ")]
    assert lines, printed[-2000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture
def run_main(monkeypatch, capsys, tmp_path):
    """``run_main(name, *args)``: benchmarks/<name>.py's ``main()`` with that command line, in this
    process; returns what it printed. Its temporary folders go under the test's, and what its
    children set in the environment (huge pages, tokenizer threads) is put back afterwards."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name, value in (("THP_MEM_ALLOC_ENABLE", "0"), ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(name, os.environ.get(name, value))

    def run(name: str, *args: str) -> str:
        module = importlib.import_module(name)
        monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / f"{name}.py"), *args])
        capsys.readouterr()
        module.main()
        return capsys.readouterr().out

    return run


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    """The tiny in-code policy saved as a folder, as trl_vs_ours.py saves it for both trainers."""
    trl_vs_ours = importlib.import_module("trl_vs_ours")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("tiny_model")))
        return trl_vs_ours.save_tiny_model()


def keep_attributes(monkeypatch, owner, names) -> None:
    """Have ``monkeypatch`` put ``owner``'s attributes back after a benchmark wraps them in place."""
    for name in names:
        monkeypatch.setattr(owner, name, getattr(owner, name))


# ------------------------------------------------------------------------------------------ imports
@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_imports_and_has_a_main(name):
    module = importlib.import_module(name)
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"


# ---------------------------------------------------------------------------- --help where a run can't
HELP_ONLY = {  # script -> an option its --help must list (what it needs that this suite has not)
    "code_task_smollm2": "--eval-every",  # vLLM and SmolLM2, minutes
    "gpu_decode_step": "--skip-compile",  # a GPU
    "gpu_head": "--budgets-mb",  # a GPU
    "lora_sync": "--syncs",  # vLLM and SmolLM2 (its sync loop: below)
    "nccl_watchdog_check": "--timeout-s",  # a GPU and NCCL
    "network_other_user": "--start-timeout",  # root and a vLLM server
    "scale_out_runs": "--steps",  # two ranks and a vLLM server, minutes (its config: below)
    "sync_cost": "--bucket-mb",  # a launched vLLM server
    "weight_sync": "--server",  # vLLM and SmolLM2 (its config: below)
}


@pytest.mark.parametrize("name", sorted(HELP_ONLY))
def test_benchmarks_that_need_more_than_a_cpu_answer_help(name, run_main, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_main(name, "--help")
    assert stopped.value.code == 0
    assert HELP_ONLY[name] in capsys.readouterr().out


def test_lora_sync_times_verified_merged_syncs(monkeypatch):
    """lora_sync.py's loop (it passed the module to WeightSync.sync, which takes PolicyWeights since
    weight_push.py was split out of the module) against an engine with weights of its own."""
    lora_sync = importlib.import_module("lora_sync")
    for rank in (0, 4):
        policy, tokenizer = lora_sync.lora_policy("tiny", rank)
        engine = OwnWeightsEngine(load_policy(ModelConfig(name_or_path="tiny"))[0], tokenizer.eos_token_id)
        result = lora_sync.timed_syncs(policy, tokenizer, engine, rank, syncs=2)
        assert len(result["sync_seconds"]) == 2 and finite(*result["sync_seconds"])
        assert result["max_probe_diff"] < 1e-3  # the engine serves the merged weights
        assert engine.weight_version == 1
        assert (result["trained_params"] < 20_000) == (rank > 0)  # adapters only, or the whole tiny model
