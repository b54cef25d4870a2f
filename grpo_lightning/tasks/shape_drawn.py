"""``task=shape_drawn``: an environment that answers with a picture, for a vision-language policy.

Two turns: the prompt asks the model whether it is ready (text only); whatever it answers, the
environment draws a shape (``tasks/shapes.py``'s pictures: a coloured circle, square or triangle)
and asks ``shape? c s t`` in a message whose content holds the picture as an image part,
``{"type": "image", "image": <PIL image>}``; the second turn is scored: 1 when its first
character is the shape's letter, else 0 (chance 1/3). The shape comes from the reset seed, so a
group's episodes see the same picture. Written in the tiny VLM's alphabet:
``grpo-lightning model=tiny_vlm task=shape_drawn``. How a picture travels through an episode:
docs/environments.md (Environments with images).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, task_name
from grpo_lightning.environments.base import ENVIRONMENTS, Reset, Step, Turn
from grpo_lightning.environments.limits import EpisodeTaskConfig
from grpo_lightning.tasks.base import Check, checked
from grpo_lightning.tasks.shapes import QUESTIONS, question

READY = "draw?"


@dataclass
class ShapeDrawnTaskConfig(EpisodeTaskConfig):
    name: str = task_name("shape_drawn")
    environment: str = option("shape_drawn", "The environment: a name registered in ENVIRONMENTS.")
    rewards: dict[str, float] = option(
        {"environment": 1.0}, "Reward function name -> weight (environment: 1 for the shape's letter)."
    )
    max_turns: int = option(2, "Model turns: the reply to the prompt, then the answer about the picture.")
    val_fraction: float = option(0.125, "Share of the games held out (played every eval.every_n_steps: val/*).")
    num_games: int = option(256, "Prompt records per epoch (each one game; the shape comes from the reset seed).")
    image_size: int = option(32, "Side in pixels of the picture the environment draws.")
    images_per_episode: int = option(1, "Pictures per episode: the one shape drawn (the memory estimate counts it).")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.max_turns >= 2, f"{p}max_turns={self.max_turns} must be >= 2 (the picture comes second)")
        check(problems, self.num_games >= 1, f"{p}num_games={self.num_games} must be >= 1")
        check(problems, self.image_size >= 16, f"{p}image_size={self.image_size} must be >= 16")
        return problems


class ShapeDrawnEnv:
    """Asks, then draws the shape of the reset seed and scores the answer's first character."""

    def __init__(self, image_size: int = 32):
        self.image_size = image_size
        self.picture, self.shape, self.shown = None, "", False

    def reset(self, seed: int, row: dict) -> Reset:
        (self.picture,), self.shape = question("shape", random.Random(seed), self.image_size)
        self.shown = False
        return Reset(messages=[{"role": "user", "content": READY}], info={"shape": self.shape})

    def step(self, turn: Turn) -> Step:
        if not self.shown:
            self.shown = True
            parts = [{"type": "image", "image": self.picture}, {"type": "text", "text": QUESTIONS["shape"][0]}]
            return Step([{"role": "user", "content": parts}], None, False)
        right = turn.text.strip()[:1] == self.shape
        return Step([], float(right), True, {"success": right})

    def close(self) -> None:
        """Nothing to release."""


@ENVIRONMENTS.register("shape_drawn")
def shape_drawn_env(options: ShapeDrawnTaskConfig, row: dict) -> ShapeDrawnEnv:
    return ShapeDrawnEnv(getattr(options, "image_size", 32))


@TASKS.register("shape_drawn", options=ShapeDrawnTaskConfig)
def shape_drawn(options: ShapeDrawnTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    records = [{"prompt": READY, "game": i} for i in range(options.num_games)]
    num_val = int(len(records) * options.val_fraction)
    return checked(options.name, records[num_val:], records[:num_val], check)
