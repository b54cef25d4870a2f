"""``task.*``: where the prompts come from and how completions are rewarded.

Reward names are checked where rewards live (:mod:`grpo_lightning.rewards`), not here: the
schema imports nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from grpo_lightning.config.base import Schema, check, choice, option

TASKS = ("arithmetic", "reasoning_gym", "gsm", "dataset")


@dataclass
class TaskConfig(Schema):
    name: str = option("arithmetic", f"The prompt source, one of {TASKS}.")
    max_operand: int = option(9, "arithmetic: operands run from 0 to this value.")
    operators: str = option("+", "arithmetic: operators to draw from, any of '+-*'.")
    val_fraction: float = option(0.2, "Share of the prompts held out for validation.")
    seed: int = option(0, "Seed of the train / validation split.")
    rewards: dict[str, float] = option(
        {"arithmetic_exact": 0.5, "arithmetic_close": 0.5},
        "Reward function name -> weight; the total reward is the weighted sum.",
    )
    correctness_reward: Optional[str] = option(
        "arithmetic_exact", "The reward whose score 1 means 'correct' (val/accuracy, val/pass@k); null: no evaluation."
    )
    dataset: str = option("basic_arithmetic", "reasoning_gym: the dataset name (e.g. basic_arithmetic, chain_sum).")
    dataset_options: dict[str, Any] = option(
        {}, "reasoning_gym: keyword arguments of the dataset's config, on top of its defaults (e.g. max_terms: 2)."
    )
    size: int = option(
        1000, "reasoning_gym: problems generated (train + validation); gsm: at most this many of the 100 questions."
    )
    system_prompt: Optional[str] = option(
        None, "System message put before each prompt by the chat template; null keeps the tokenizer's default."
    )
    instruction: str = option("", "Text appended to every question, e.g. how to format the answer; empty adds nothing.")
    truncate_prompts: bool = option(
        False, "Keep the last tokens of a prompt too long for the context and report it; false stops naming the row."
    )
    chat_template: bool = option(
        True, "Wrap prompts in the tokenizer's chat template when it has one (instruction-tuned models)."
    )
    max_completion_chars: int = option(
        0, "length_penalty: completions longer than this many characters lose reward; 0 turns it off."
    )
    overlong_buffer_tokens: int = option(
        0, "overlong_penalty: the penalty ramps over the last this many tokens of the budget; 0: a fifth of it."
    )
    path: Optional[str] = option(
        None, "dataset: the training prompts, a .jsonl/.json/.parquet/.csv file or a datasets.save_to_disk folder."
    )
    val_path: Optional[str] = option(
        None, "dataset: held-out prompts like task.path; null splits task.val_fraction off task.path."
    )
    prompt_column: str = option(
        "prompt", "dataset: the prompt column (text or chat messages); other columns reach the rewards as kwargs."
    )
    reward_modules: list[str] = option(
        [], "Deprecated alias of the top-level plugins=[...]: files or modules to import."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}name", self.name, TASKS)
        check(problems, bool(self.rewards), f"{p}rewards is empty; name at least one reward function")
        check(
            problems,
            self.name != "dataset" or bool(self.path),
            "task=dataset needs task.path=PATH: a .jsonl, .json, .parquet or .csv file or a datasets.save_to_disk folder",
        )
        check(problems, self.size >= 1, f"{p}size={self.size} must be >= 1")
        check(
            problems,
            self.max_completion_chars >= 0,
            f"{p}max_completion_chars={self.max_completion_chars} must be >= 0 (0 = off)",
        )
        check(problems, 0 <= self.val_fraction < 1, f"{p}val_fraction={self.val_fraction} must be in [0, 1)")
        return problems
