"""``logger.*``: where metrics go (wandb, CSV or nowhere) and the completions table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_lightning.config.base import Schema, check, choice, option

LOGGERS = ("wandb", "csv", "none")


@dataclass
class LoggerConfig(Schema):
    kind: str = option("wandb", f"Metrics logger, one of {LOGGERS}.")
    project: str = option("grpo_lightning", "wandb project name.")
    table_every_n_steps: int = option(
        10,
        "Sample completions (prompt, completion, rewards) every n steps: a wandb table and completions.jsonl; 0: off.",
    )
    table_rows: int = option(
        16, "Rows of each completions sample (the first groups of the batch), in wandb and completions.jsonl."
    )
    report_png: bool = option(
        True, "Draw report.png (the run's curves in one picture) at checkpoints and at the end; summary.json is kept."
    )
    run_name: Optional[str] = option(None, "wandb run name; null lets wandb pick.")
    offline: Optional[bool] = option(
        None, "Force wandb offline (true) or online (false); null: offline unless WANDB_API_KEY is set."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}kind", self.kind, LOGGERS)
        check(
            problems,
            self.table_every_n_steps >= 0,
            f"{p}table_every_n_steps={self.table_every_n_steps} must be >= 0 (0 = off)",
        )
        check(problems, self.table_rows >= 1, f"{p}table_rows={self.table_rows} must be >= 1")
        return problems
