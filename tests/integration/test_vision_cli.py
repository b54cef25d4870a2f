"""Both VLM families load from a saved folder and train 2 steps through the CLI on the HF engine, with
images from a jsonl file; the run's outputs record the images and the export holds the processor."""

from __future__ import annotations

import csv
import json
import math
import random
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.vision import FAMILIES, random_image, save_tiny_vlm

from grpo_lightning import train
from grpo_lightning.config.task import task_options
from grpo_lightning.tasks import task_records

QUESTION = [{"role": "user", "content": "how many?"}]


def image_rows(folder: Path, count: int = 4) -> str:
    """A jsonl file of prompts with 1-2 images each, by paths relative to the file."""
    rng = random.Random(0)
    (folder / "pics").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        names = []
        for j in range(1 + i % 2):
            random_image(rng).save(folder / "pics" / f"{i}_{j}.png")
            names.append(f"pics/{i}_{j}.png")
        rows.append({"prompt": QUESTION, "images": names, "answer": str(i)})
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_cli(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        train.cli()
    except SystemExit as stop:
        assert stop.code in (0, None), f"exit {stop.code}"


def run_args(model_folder: str, data: str, out: Path) -> list[str]:
    """A 2-step run on the jsonl ``data`` with ``model_folder``'s VLM, its outputs in ``out``."""
    return [
        f"model.name_or_path={model_folder}",
        "task=dataset",
        f"task.path={data}",
        "+task.rewards={shapes_short: 1.0}",
        "task.val_fraction=0",
        "rollout.prompts_per_step=2",
        "rollout.num_generations=4",
        "rollout.max_new_tokens=3",
        "trainer.max_steps=2",
        "logger=csv",
        "logger.report_png=false",  # matplotlib's import and drawing: not what these runs check
        f"hydra.run.dir={out}",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_vlm_trains_two_steps_through_the_cli(family, tiny_vlm_folders, tmp_path, monkeypatch):
    data, out = image_rows(tmp_path / "data"), tmp_path / "run"
    run_cli(monkeypatch, *run_args(tiny_vlm_folders[family], data, out), "logger.table_every_n_steps=1")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert rows and all(r["images"] and r["images"][0].endswith(".png") for r in rows)
    assert all("<image:" in r["prompt"] for r in rows)
    assert (out / "hf" / "final" / "processor_config.json").is_file()


def test_an_environment_that_answers_with_a_picture_trains_two_steps(tmp_path, monkeypatch):
    """task=shape_drawn: the picture arrives in the environment's reply, its image tokens have loss mask 0."""
    out = tmp_path / "run"
    args = ["model=tiny_vlm", "task=shape_drawn", "rollout.prompts_per_step=2", "rollout.num_generations=2"]
    run_cli(monkeypatch, *args, "trainer.max_steps=2", "eval.num_prompts=2", "logger=csv", f"hydra.run.dir={out}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert rows and all(r["images"] and r["images"][0].startswith("sha:") for r in rows)
    for row in rows:
        reply = next(t for t in row["turns"] if t["role"] == "environment")
        assert reply["loss_mask"] == 0 and "<|image_pad|>" in reply["text"]
        assert reply["messages"][0]["content"][0] == {"type": "image", "image": row["images"][0]}


def test_a_tiny_vlm_distills_from_a_vlm_teacher_folder_through_the_cli(tmp_path, monkeypatch):
    """model=tiny_vlm task=shapes with algorithm.teacher.path=<a saved tiny VLM of other weights>: 2 steps,
    the teacher pass over the images, distill/* logged and finite."""
    teacher, out = save_tiny_vlm("llava", str(tmp_path / "teacher"), seed=1), tmp_path / "run"
    args = ["model=tiny_vlm", "task=shapes", f"algorithm.teacher.path={teacher}", "algorithm.beta=0"]
    args += ["rollout.prompts_per_step=2", "rollout.num_generations=2", "trainer.max_steps=2", "logger=csv"]
    run_cli(monkeypatch, *args, "task.size=16", f"hydra.run.dir={out}")
    rows = list(csv.DictReader(next(out.glob("csv/*/metrics.csv")).open()))
    logged = [r for r in rows if r.get("distill/kl")]
    assert len(logged) == 2, rows
    for row in logged:
        values = [float(row[k]) for k in ("distill/kl", "distill/kl_k3", "distill/advantage_mean")]
        assert all(math.isfinite(v) for v in values) and float(row["distill/kl_k3"]) > 0  # another teacher: KL > 0
        assert 0 <= float(row["distill/argmax_agreement"]) <= 1
    # task=shapes' group_column: each question type's held-out accuracy, weighing its own rows
    _, held_out = task_records(task_options("shapes", size=16))
    counts = Counter(r["question_type"] for r in held_out)
    evaluated = [r for r in rows if r.get("val/accuracy")]
    assert evaluated and counts, rows
    for row in evaluated:
        by_type = {t: float(row[f"val/{t}/accuracy"]) for t in counts}
        mean = sum(by_type[t] * n for t, n in counts.items()) / sum(counts.values())
        assert float(row["val/accuracy"]) == pytest.approx(mean, abs=1e-6), row
