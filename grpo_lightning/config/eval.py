"""``eval.*``: the held-out evaluation (val/accuracy, greedy, and val/pass@k; episode tasks: val/reward,
val/success, val/turns, ... of held-out episodes, docs/environments.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_lightning.config.base import Schema, check, option


@dataclass
class EvalConfig(Schema):
    every_n_steps: int = option(
        0, "Validate on the held-out split every n training steps; 0 validates once, at the end of training."
    )
    before_training: bool = option(
        True, "Validate once before the first step too (the baseline accuracy); the CLI and build.fit honour it."
    )
    num_prompts: int = option(64, "Held-out prompts evaluated (the first ones of the validation split).")
    batch_size: int = option(32, "Held-out prompts per validation batch.")
    max_new_tokens: Optional[int] = option(None, "Completion budget when evaluating; null uses rollout.max_new_tokens.")
    pass_k: int = option(
        0, "Also sample k completions per prompt (rollout temperature) and log val/pass@k; 0 only decodes greedily."
    )
    greedy: bool = option(
        True, "Episode tasks: play held-out episodes greedily (top_k=1); false samples at rollout.temperature."
    )
    samples_per_row: int = option(
        1, "Episode tasks: episodes played per held-out row, each with its own fixed seed; > 1 adds val/pass@k."
    )
    checkpoint: Optional[str] = option(
        None,
        "grpo-lightning-eval only: the policy to evaluate, an hf/final folder, a .ckpt file or a run's output folder.",
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(
            problems,
            self.every_n_steps >= 0,
            f"{p}every_n_steps={self.every_n_steps} must be >= 0 (0 = at the end only)",
        )
        check(problems, self.num_prompts >= 0, f"{p}num_prompts={self.num_prompts} must be >= 0")
        check(problems, self.batch_size >= 1, f"{p}batch_size={self.batch_size} must be >= 1")
        check(problems, self.pass_k >= 0, f"{p}pass_k={self.pass_k} must be >= 0 (0 = greedy only)")
        check(problems, self.samples_per_row >= 1, f"{p}samples_per_row={self.samples_per_row} must be >= 1")
        check(
            problems,
            self.max_new_tokens is None or self.max_new_tokens >= 1,
            f"{p}max_new_tokens={self.max_new_tokens} must be >= 1 or null",
        )
        return problems
