"""task=shapes: every answer is what its picture shows (read back from the pixels), and the rewards
score the first character, the options and the one-character format."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_lightning.config import TaskConfig
from grpo_lightning.models.vision.tiny import build_tiny_vlm, build_vision_tokenizer
from grpo_lightning.tasks import task_records
from grpo_lightning.tasks.shapes import COLORS, QUESTIONS, shapes_exact, shapes_option, shapes_records, shapes_short


def lit(image) -> np.ndarray:
    return np.asarray(image).sum(axis=2) > 0


def read_answer(kind: str, images: list) -> str:
    """The answer from the pixels alone."""
    pixels, mask = np.asarray(images[0]).astype(int), lit(images[0])
    size = mask.shape[0]
    if kind == "color":
        mean = pixels[mask].mean(axis=0)
        return min(COLORS, key=lambda c: np.abs(np.array(COLORS[c]) - mean).sum())
    if kind == "side":  # the shape lies wholly in one half: one across the middle has no side
        columns = np.nonzero(mask)[1]
        if columns.max() < size // 2:
            return "<"
        return ">" if columns.min() >= size // 2 else "across the middle"
    if kind == "count":
        half = size // 2
        return str(sum(bool(mask[y : y + half, x : x + half].any()) for y in (0, half) for x in (0, half)))

    def shape(m: np.ndarray) -> str:
        ys, xs = np.nonzero(m)
        fill = m.sum() / ((np.ptp(ys) + 1) * (np.ptp(xs) + 1))  # square ~1, circle ~pi/4, triangle ~1/2
        return "s" if fill > 0.92 else "c" if fill > 0.65 else "t"

    if kind == "shape":
        return shape(mask)
    return "=" if shape(mask) == shape(lit(images[1])) else "!"


@pytest.mark.parametrize("kind", list(QUESTIONS))
def test_every_answer_is_what_the_picture_shows(kind):
    records = shapes_records(120, 32, (kind,), seed=3)
    assert {r["question_type"] for r in records} == {kind}
    assert all(len(r["images"]) == (2 if kind == "same" else 1) for r in records)
    for index, record in enumerate(records):
        assert record["answer"] in record["options"]
        assert read_answer(kind, record["images"]) == record["answer"], index
    answers = {r["answer"] for r in records}
    assert answers == set(QUESTIONS[kind][1]), "every option occurs"


def test_no_two_question_types_share_an_option():
    """A character valid for two types is where a policy that cannot see settles (red and right were both r)."""
    options = [set(o) for _, o in QUESTIONS.values()]
    assert all(a.isdisjoint(b) for i, a in enumerate(options) for b in options[i + 1 :])


def test_the_task_splits_and_is_seeded():
    train, val = task_records(TaskConfig(name="shapes", seed=1))
    assert len(train) + len(val) == 2000 and len(val) == 200
    again, _ = task_records(TaskConfig(name="shapes", seed=1))
    assert [r["answer"] for r in again] == [r["answer"] for r in train]
    assert np.array_equal(np.asarray(again[0]["images"][0]), np.asarray(train[0]["images"][0]))


def test_the_rewards():
    completions = ["r", "r5", " g", "x", "", "rg"]
    answer, options, kinds = ["r"] * 6, ["rgby"] * 6, ["color"] * 3 + ["side"] * 3
    logged = {}
    assert shapes_exact(None, completions, answer, kinds, log_metric=logged.__setitem__) == [1, 1, 0, 0, 0, 1]
    assert logged == {"shapes_color": pytest.approx(2 / 3), "shapes_side": pytest.approx(1 / 3)}
    assert shapes_option(None, completions, options) == [1, 1, 1, 0, 0, 1]
    assert shapes_short(None, completions) == [1, 0, 1, 1, 0, 0]
    chat = [[{"role": "assistant", "content": "r"}]]
    assert shapes_exact(None, chat, ["r"], ["color"]) == [1.0]


def test_the_untrained_tiny_vlm_tower_tells_left_from_right():
    """The "side?" questions stayed at chance, even under supervised training, while CLIP's 0.02-scale position embeddings
    left a random tower all but blind to where a patch is (docs/vision.md): a least-squares probe on the
    untrained tiny LLaVA's mean image features then read the side of held-out pictures at 0.55; with
    position embeddings at the scale of a patch's content it reads it well above chance."""
    tokenizer = build_vision_tokenizer("llava")
    model, processor = build_tiny_vlm(tokenizer, "llava")
    records = shapes_records(300, 32, ("side",), seed=0)
    pixels = processor.image_processor([r["images"][0] for r in records], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        features = torch.stack(list(model.get_image_features(pixel_values=pixels).pooler_output)).mean(dim=1)
    x = torch.cat([features, torch.ones(len(records), 1)], dim=1).double()
    left = torch.tensor([r["answer"] == "<" for r in records])
    train, held_out = slice(0, 200), slice(200, 300)
    w = torch.linalg.solve(
        x[train].T @ x[train] + 1e-3 * torch.eye(x.shape[1]).double(), x[train].T @ (2.0 * left[train] - 1).double()
    )
    accuracy = ((x[held_out] @ w > 0) == left[held_out]).double().mean().item()
    assert accuracy >= 0.7, accuracy  # 0.55 with CLIP's own init
