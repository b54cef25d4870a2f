"""vLLM (the CPU build) with vision-language policies. A saved LLaVA folder trains 2 steps through the
CLI on CPU vLLM (in a process of its own: one engine per process): prompts with 1-2 images go in as
multimodal data and come back expanded as the trainer's processor expands them (else the engine stops),
and the engine's log-probs of its samples are the trainer's at both steps, the second after a sync that
changed the trained tower (the same images again: vLLM's encoder cache must have been reset). The
Qwen2-VL family cannot run on vLLM without torchvision (vLLM 0.32 processes its images with
transformers' video processor): refused in one line before any model loads, with a server too. A VLM on a
vLLM server: test_vllm_server_vision.py."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_inputs import assert_one_clear_line, run_cli
from test_vision_cli import image_rows, run_args

from grpo_lightning import build
from grpo_lightning.models.vision import loading as vision_loading

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def environment() -> dict[str, str]:
    return dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HELPERS) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )


@pytest.mark.slow
def test_a_saved_llava_folder_trains_two_steps_on_cpu_vllm_through_the_cli(tiny_vlm_folders, tmp_path):
    data, out = image_rows(tmp_path / "data", count=2), tmp_path / "run"  # the same prompts at both steps
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_lightning.train",
            "rollout=vllm",
            "rollout.vllm.max_model_len=256",
            "rollout.vllm.kv_cache_gib=0.25",
            "model.freeze_vision=false",  # the tower changes at the sync: cached image embeddings would be stale
            "algorithm.pack_sequences=true",
            *run_args(tiny_vlm_folders["llava"], data, out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env=environment(),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [metrics] = out.glob("csv/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("rollout/logp_diff_mean")]
    assert len(rows) == 2 and all(float(r["rollout/logp_diff_mean"]) < 1e-4 for r in rows), rows
    lines = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert lines and all(line["images"] for line in lines)


def test_the_qwen2_vl_family_on_vllm_is_refused_before_any_model_loads(tiny_vlm_folders, monkeypatch, tmp_path, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(build, "load_policy", no_model)
    monkeypatch.setattr(vision_loading, "load_vision_policy", no_model)
    cases = (
        (f"model.name_or_path={tiny_vlm_folders['qwen2_vl']}",),
        ("model=tiny_vlm", "model.tiny_vlm.family=qwen2_vl"),
        (f"model.name_or_path={tiny_vlm_folders['qwen2_vl']}", "rollout.vllm.server.launch=true"),  # no server starts
    )
    for model in cases:
        code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, ("rollout=vllm", *model, "task=shapes"))
        assert_one_clear_line(code, err, seconds, ("rollout.engine=vllm", "qwen2_vl", "torchvision"), tmp_path / "run")


def test_a_vlm_in_a_vllm_engine_process_or_pipeline_mode_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    """Images reach the in-process engine and a server (test_vllm_server_vision.py), no separate engine process,
    and a server in rollout.mode=sync only (docs/vision.md)."""
    cases = {
        "rollout.vllm.in_process=false": ("rollout.vllm.in_process=false", "rollout.vllm.server.launch=true"),
        "rollout.mode=pipeline": ("rollout.mode=pipeline", "vision-language", "rollout.mode=sync"),
    }
    for where, said in cases.items():
        extra = ("rollout.vllm.server.launch=true",) if where == "rollout.mode=pipeline" else ()
        code, err, seconds = run_cli(
            monkeypatch, tmp_path, capsys, ("rollout=vllm", "model=tiny_vlm", where, *extra, "task=shapes")
        )
        assert_one_clear_line(code, err, seconds, said, tmp_path / "run")
