"""Bad images stop the run before any model loads, each in one line naming the file and row (exit 2):
a missing file, bytes that are not an image (a path, a parquet column), images for a model that takes
none, more images than image parts, a string prompt with images, a prompt too long with its image
tokens. Good images in every format (jsonl paths, parquet bytes, a save_to_disk Image feature) load."""

from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import pytest
from PIL import Image
from test_bad_inputs import assert_one_clear_line, run_cli

from grpo_lightning import build
from grpo_lightning.config import ModelConfig, TrainConfig
from grpo_lightning.data.files import prompt_check, read_records
from grpo_lightning.data.images import image_refs, load_image
from grpo_lightning.models.vision import loading as vision_loading

pytestmark = pytest.mark.spread_over_workers

QUESTION = [{"role": "user", "content": "what is it?"}]


def png(color=(255, 0, 0), size=(8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad_images")
    (root / "pics").mkdir()
    (root / "pics" / "red.png").write_bytes(png())
    (root / "pics" / "broken.png").write_bytes(b"\x89PNG not really")
    good = {"prompt": QUESTION, "images": ["pics/red.png"], "answer": "1"}
    out = {
        "good": jsonl(root / "good.jsonl", [good] * 4),
        "missing": jsonl(root / "missing.jsonl", [good, {**good, "images": ["pics/red.png", "pics/nope.png"]}]),
        "broken": jsonl(root / "broken.jsonl", [good, good, {**good, "image": "pics/broken.png", "images": None}]),
        "parts": jsonl(
            root / "parts.jsonl",
            [
                good,
                {
                    **good,
                    "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
                    "images": ["pics/red.png", "pics/red.png"],
                },
            ],
        ),
        "string": jsonl(root / "string.jsonl", [{**good, "prompt": "what is it?"}]),
        "too_long": jsonl(root / "too_long.jsonl", [good, {**good, "images": ["pics/red.png"] * 20}]),
    }
    datasets.Dataset.from_list(
        [
            {"prompt": QUESTION, "images": [png()], "answer": "1"},
            {"prompt": QUESTION, "images": [b"junk"], "answer": "1"},
        ]
    ).to_parquet(str(root / "bytes.parquet"))
    out["parquet"] = str(root / "bytes.parquet")
    feature = datasets.Dataset.from_dict(
        {"prompt": [QUESTION] * 3, "image": [png((0, 255, 0)), png((0, 0, 255), (20, 10)), png()], "answer": ["1"] * 3}
    ).cast_column("image", datasets.Image())
    feature.save_to_disk(str(root / "saved"))
    out["saved"] = str(root / "saved")
    good_parquet = datasets.Dataset.from_list([{"prompt": QUESTION, "images": [png()], "answer": "1"}] * 3)
    good_parquet.to_parquet(str(root / "good.parquet"))
    out["good_parquet"] = str(root / "good.parquet")
    return out


def vlm_dataset(path: str, model: str = "tiny_vlm") -> tuple[str, ...]:
    return (
        f"model={model}" if model == "tiny_vlm" else f"model.name_or_path={model}",
        "task=dataset",
        f"task.path={path}",
        "+task.rewards={arithmetic_exact: 1.0}",
        "rollout.prompts_per_step=1",
    )


CASES = [
    ("missing_file", "missing", "tiny_vlm", ("missing.jsonl row 1", "image 1", "no such file", "nope.png")),
    ("unreadable_bytes", "broken", "tiny_vlm", ("broken.jsonl row 2", "image 0", "not an image Pillow can read")),
    ("unreadable_parquet_bytes", "parquet", "tiny_vlm", ("bytes.parquet row 1", "image 0", "4 bytes")),
    ("image_for_a_text_model", "good", "tiny", ("good.jsonl row 0", "takes none", "model.name_or_path='tiny'")),
    ("more_images_than_parts", "parts", "tiny_vlm", ("parts.jsonl row 1", "2 image(s)", "1 {'type': 'image'} part")),
    ("string_prompt_with_images", "string", "tiny_vlm", ("string.jsonl row 0", "chat messages", "as TRL requires")),
    ("too_long_with_its_images", "too_long", "tiny_vlm", ("too_long.jsonl row 1", "image tokens", "never cut")),
]


@pytest.mark.parametrize("case, file, model, said", CASES, ids=[c[0] for c in CASES])
def test_a_bad_image_ends_in_one_line_before_any_model_loads(
    case, file, model, said, files, monkeypatch, tmp_path, capsys
):
    def no_model(*args, **kwargs):
        raise AssertionError("a model loaded before the images were vetted")

    monkeypatch.setattr(build, "load_policy", no_model)
    monkeypatch.setattr(vision_loading, "load_vision_policy", no_model)
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, vlm_dataset(files[file], model))
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")


@pytest.mark.parametrize("file", ["good", "good_parquet", "saved"])
def test_good_images_load_from_every_format(file, files):
    """jsonl paths (relative to the file), parquet bytes, a save_to_disk datasets Image feature."""
    cfg = TrainConfig()
    cfg.model = ModelConfig(name_or_path="tiny_vlm")
    records = read_records(files[file], "task.path", "prompt")
    prompt_check(cfg)(records, files[file])  # no error
    assert all(load_image(ref).mode == "RGB" for r in records for ref in image_refs(r))


def test_an_image_environment_on_vllm_ends_in_one_line(monkeypatch, tmp_path, capsys):
    """vLLM engines and the server take no episode pictures yet: refused before any model loads (pipeline mode
    refuses every episode task in the config check)."""

    def no_model(*args, **kwargs):
        raise AssertionError("a model loaded before the engine was refused")

    monkeypatch.setattr(build, "load_policy", no_model)
    args = ("model=tiny_vlm", "task=shape_drawn", "rollout=vllm")
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, args)
    said = ("episodes of a vision-language policy (llava)", "rollout.engine=hf", "do not take an environment's images")
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")


def test_an_environments_picture_for_a_text_policy_ends_in_one_line(monkeypatch, tmp_path, capsys):
    """The first episodes (the evaluation before training here) name the environment and the turn."""
    alphabet = "model.tiny.alphabet='abcdefghijklmnopqrstuvwxyz? '"  # the task's text, for the tiny text model
    args = ("model=tiny", "task=shape_drawn", alphabet, "rollout.prompts_per_step=1", "rollout.num_generations=2")
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, args, fit_allowed=True)  # refused in an episode
    said = ("environment 'shape_drawn': step() of turn 1 returned 1 image(s)", "text-only model", "model=tiny_vlm")
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")
