"""``task=guess_number``: a multi-turn game without tools. The environment hides a number in
``1..max_number``; the model guesses, the environment answers ``+`` (higher), ``-`` (lower) or
``=`` (found, the episode ends). Solving earns ``1 - turn_cost x (turns - 1)``, so fewer turns
earn more; a policy that halves the range (binary search) is optimal.

Written in the tiny character tokenizer's alphabet, so the in-code policy plays it on a CPU:
the prompt is ``1-8?``, a guess is a number, each reply one character. Every episode of a group
plays the same hidden number (the group's reset seed): the group baseline compares strategies,
not luck.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, task_name
from grpo_lightning.environments.base import ENVIRONMENTS, Reset, Step, Turn
from grpo_lightning.environments.limits import EpisodeTaskConfig
from grpo_lightning.tasks.base import Check, checked

HIGHER, LOWER, FOUND, UNREADABLE = "+", "-", "=", "?"


@dataclass
class GuessNumberTaskConfig(EpisodeTaskConfig):
    name: str = task_name("guess_number")
    environment: str = option("guess_number", "The environment: a name registered in ENVIRONMENTS.")
    rewards: dict[str, float] = option(
        {"environment": 1.0}, "Reward function name -> weight (environment: the game's)."
    )
    val_fraction: float = option(0.125, "Share of the games held out (played every eval.every_n_steps: val/*).")
    max_turns: int = option(6, "Guesses per game at most (stop reason max_turns).")
    max_number: int = option(8, "The hidden number is drawn from 1..max_number.")
    turn_cost: float = option(0.1, "Reward lost per guess after the first; solving earns 1 - turn_cost x (turns - 1).")
    num_games: int = option(256, "Prompt records per epoch (each one game; the number comes from the reset seed).")
    model_defaults: dict[str, Any] = option(
        {
            "tiny": {"rollout.max_new_tokens": 3},  # a guess: a number, in the tiny model's alphabet
            # 16 episodes a step and 8 held-out games: a step and an evaluation within minutes on a CPU
            "smollm2_135m": {"rollout.max_new_tokens": 8, "rollout.prompts_per_step": 2, "eval.num_prompts": 8},
        },
        "Defaults this task brings per model: the turn budget and the batch.",
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.max_number >= 2, f"{p}max_number={self.max_number} must be >= 2")
        check(problems, 0 <= self.turn_cost < 1, f"{p}turn_cost={self.turn_cost} must be in [0, 1)")
        check(problems, self.num_games >= 1, f"{p}num_games={self.num_games} must be >= 1")
        return problems


def read_guess(text: str) -> int | None:
    """The first number in the model's turn ("5", " 5 " -> 5), or None."""
    found = re.search(r"\d+", text)
    return int(found.group()) if found else None


class GuessNumberEnv:
    """One game: the hidden number comes from the reset seed, so a group's games are the same game."""

    def __init__(self, max_number: int = 8, turn_cost: float = 0.1):
        self.max_number, self.turn_cost = max_number, turn_cost
        self.secret, self.turns = 0, 0

    def reset(self, seed: int, row: dict) -> Reset:
        self.secret, self.turns = random.Random(seed).randint(1, self.max_number), 0
        return Reset(messages=[{"role": "user", "content": f"1-{self.max_number}?"}], info={"secret": self.secret})

    def step(self, turn: Turn) -> Step:
        self.turns += 1
        guess = read_guess(turn.text)
        if guess == self.secret:
            reward = max(0.0, 1.0 - self.turn_cost * (self.turns - 1))
            info = {"solved": True, "success": True, "turns": self.turns}
            return Step([{"role": "user", "content": FOUND}], reward, True, info)
        reply = UNREADABLE if guess is None else HIGHER if guess < self.secret else LOWER
        info = {"solved": False, "success": False, "turns": self.turns}
        return Step([{"role": "user", "content": reply}], 0.0, False, info)

    def close(self) -> None:
        """Nothing to release."""


@ENVIRONMENTS.register("guess_number")
def guess_number_env(options: GuessNumberTaskConfig, row: dict) -> GuessNumberEnv:
    return GuessNumberEnv(getattr(options, "max_number", 8), getattr(options, "turn_cost", 0.1))


@TASKS.register("guess_number", options=GuessNumberTaskConfig)
def guess_number(options: GuessNumberTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    records = [{"prompt": f"1-{options.max_number}?", "game": i} for i in range(options.num_games)]
    num_val = int(len(records) * options.val_fraction)
    return checked(options.name, records[num_val:], records[:num_val], check)
