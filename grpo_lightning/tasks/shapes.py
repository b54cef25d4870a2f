"""``task=shapes``: pictures drawn with PIL (coloured shapes, counts, positions) and one-character
answers a reward can check, for vision-language policies (``model=tiny_vlm``).

Each question type has a few options, so chance is known per type (``1 / options``): a color
(``r g b y``), a shape (``c s t``: circle, square, triangle), a count of shapes (``1 2 3 4``), the side
a shape is on (``< >``), and, with two images, whether both show the same shape (``= !``). The
text says the type and lists the options, so what a policy must learn beyond the format is in the
picture. No two types share an option: a character valid for several (red and right were both
``r``) is where a policy that cannot see yet settles, answering it to every question, and a
policy that answers one thing to a group learns nothing more (every reward of the group equal).
``shapes_exact`` scores the first character (the answer) and logs each type's accuracy
(``reward/shapes_<type>``); it is the task's only reward by default. ``shapes_option`` (any option
first) and ``shapes_short`` (one character, then EOS) are partial credit for other budgets and
models: with the tiny VLM, credit for any option made a type's answers collapse onto one option
before its pictures were read (docs/vision.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.rewards.registry import register_reward
from grpo_lightning.tasks.base import Check, checked, split

COLORS = {"r": (230, 40, 40), "g": (40, 200, 60), "b": (50, 90, 240), "y": (240, 220, 40)}
SHAPES = ("c", "s", "t")
QUESTIONS = {  # type -> (the question, its options)
    "color": ("color? r g b y", "rgby"),
    "shape": ("shape? c s t", "cst"),
    "count": ("count? 1 2 3 4", "1234"),
    "side": ("side? < >", "<>"),
    "same": ("same shape? = !", "=!"),
}


@dataclass
class ShapesTaskConfig(TaskConfig):
    name: str = task_name("shapes")
    size: int = option(2000, "Questions generated (each with its own picture), before the validation split.")
    image_size: int = option(32, "Side in pixels of each picture.")
    question_types: list[str] = option(
        ["color", "shape", "count", "side"],
        f"Question types to draw from, any of {list(QUESTIONS)} (same: two images).",
    )
    model_defaults: dict[str, Any] = option(
        {
            # An answer is one character, one token of the tiny VLM: a second token (EOS or not) only adds
            # noise to every sample's gradient, and with it the policy never learnt shape or count
            # (docs/vision.md). So every completion ends at the budget by design: F7 is not a failure here.
            "tiny_vlm": {
                "rollout.max_new_tokens": 1,
                "health.truncation.action": "ignore",
                "rollout.prompts_per_step": 64,
                "trainer.max_steps": 600,
                "eval.num_prompts": 200,
            },
        },
        "Defaults this task brings per model: the tiny VLM's one-token answers, batch and run length.",
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.size >= 2, f"{p}size={self.size} must be >= 2")
        check(problems, self.image_size >= 16, f"{p}image_size={self.image_size} must be >= 16")
        unknown = sorted(set(self.question_types) - set(QUESTIONS))
        check(
            problems,
            bool(self.question_types) and not unknown,
            f"{p}question_types={self.question_types} must be a non-empty list of {list(QUESTIONS)}",
        )
        return problems


def draw(shapes: list[tuple[str, str, tuple[int, int], int]], size: int) -> Image.Image:
    """A black picture of ``size`` pixels with each (shape, color, center, radius) drawn."""
    image = Image.new("RGB", (size, size), (0, 0, 0))
    pen = ImageDraw.Draw(image)
    for shape, color, (x, y), r in shapes:
        box = (x - r, y - r, x + r, y + r)
        if shape == "c":
            pen.ellipse(box, fill=COLORS[color])
        elif shape == "s":
            pen.rectangle(box, fill=COLORS[color])
        else:
            pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=COLORS[color])
    return image


def _one(rng: random.Random, size: int, shape: str | None = None, side: str | None = None):
    """One shape: centred across the picture, or (``side``) a smaller one wholly inside the left or right half."""
    if side is None:
        r = 3 * size // 8 - 1
        x = size // 2
    else:
        r = size // 4 - 2
        x = rng.randint(r, size // 2 - r - 1) if side == "l" else rng.randint(size // 2 + r, size - r - 1)
    y = rng.randint(r, size - r - 1)
    return (shape or rng.choice(SHAPES), rng.choice(list(COLORS)), (x, y), r)


def question(kind: str, rng: random.Random, size: int) -> tuple[list, str]:
    """The pictures of one question of ``kind`` and its answer."""
    if kind == "color":
        s = _one(rng, size)
        return [draw([s], size)], s[1]
    if kind == "shape":
        s = _one(rng, size)
        return [draw([s], size)], s[0]
    if kind == "side":
        side = rng.choice("lr")
        return [draw([_one(rng, size, side=side)], size)], "<" if side == "l" else ">"
    if kind == "same":
        first, same = rng.choice(SHAPES), rng.random() < 0.5
        second = first if same else rng.choice([s for s in SHAPES if s != first])
        return [draw([_one(rng, size, shape=first)], size), draw([_one(rng, size, shape=second)], size)], "=!"[not same]
    count, cell, r = rng.randint(1, 4), size // 2, size // 4 - 2
    quadrants = rng.sample([(0, 0), (1, 0), (0, 1), (1, 1)], count)
    shapes = [
        (
            rng.choice(SHAPES),
            rng.choice(list(COLORS)),
            (qx * cell + rng.randint(r, cell - r - 1), qy * cell + rng.randint(r, cell - r - 1)),
            r,
        )
        for qx, qy in quadrants
    ]
    return [draw(shapes, size)], str(count)


def shapes_records(
    size: int = 2000, image_size: int = 32, kinds: tuple[str, ...] = ("color", "shape", "count", "side"), seed: int = 0
) -> list[dict]:
    """``size`` questions, the types in turn, each with its own pictures (a seeded draw)."""
    rng = random.Random(seed)
    records = []
    for i in range(size):
        kind = kinds[i % len(kinds)]
        images, answer = question(kind, rng, image_size)
        text, options = QUESTIONS[kind]
        records.append(
            {
                "prompt": [{"role": "user", "content": text}],
                "images": images,
                "answer": answer,
                "question_type": kind,
                "options": options,
            }
        )
    rng.shuffle(records)
    return records


@TASKS.register("shapes", options=ShapesTaskConfig)
def shapes(options: ShapesTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    records = shapes_records(options.size, options.image_size, tuple(options.question_types), options.seed)
    train, val = split(records, options.val_fraction)
    return checked(options.name, train, val, check)


def _answer(completion) -> str:
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    return text.strip()


@register_reward("shapes_exact")
def shapes_exact(prompts, completions, answer, question_type, log_metric=None, **_) -> list[float]:
    """1.0 when the completion's first character is the answer; logs each type's accuracy."""
    scores = [float(_answer(c)[:1] == a) for c, a in zip(completions, answer, strict=True)]
    if log_metric is not None:
        for kind in sorted(set(question_type)):
            mine = [s for s, k in zip(scores, question_type, strict=True) if k == kind]
            log_metric(f"shapes_{kind}", sum(mine) / len(mine))
    return scores


@register_reward("shapes_option")
def shapes_option(prompts, completions, options, **_) -> list[float]:
    """1.0 when the completion starts with one of the question's options."""
    return [float(_answer(c)[:1] != "" and _answer(c)[:1] in o) for c, o in zip(completions, options, strict=True)]


@register_reward("shapes_short")
def shapes_short(prompts, completions, **_) -> list[float]:
    """The format: 1.0 for a one-character answer (then EOS), else 0.0."""
    return [float(len(_answer(c)) == 1) for c in completions]
