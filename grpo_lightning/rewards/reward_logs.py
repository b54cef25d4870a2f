"""TRL's ``log_metric`` and ``log_extra`` callbacks, collected per scored batch.

A reward function that takes them can report a scalar (``log_metric("format_ratio", 0.4)``,
averaged over the calls of one batch) or a column of the completions table
(``log_extra("parsed", [...])``, one value per completion). The scorer hands a fresh collector to
each batch and the batch carries what was collected (``RolloutBatch.reward_metrics`` / ``reward_extra``),
so a batch generated ahead of its step (async rollout) reports with that step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from grpo_lightning.errors import RewardError


class RewardLogs:
    """What the reward functions of one batch logged."""

    def __init__(self, size: int):
        self.size = size
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self.extra: dict[str, list] = {}

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar, averaged over the calls in this batch."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RewardError(f"log_metric({name!r}, ...) needs a number, got a {type(value).__name__}") from None
        if not math.isfinite(number):
            raise RewardError(f"log_metric({name!r}, {value}) got a non-finite value")
        self._metrics[str(name)].append(number)

    def log_extra(self, column: str, values: list) -> None:
        """TRL's ``log_extra``: a column of the completions table, one value per completion."""
        values = list(values)
        if len(values) != self.size:
            raise RewardError(
                f"log_extra({column!r}, ...) got {len(values)} values for {self.size} completions; give one per completion"
            )
        self.extra[str(column)] = values

    def merge(self, part: RewardLogs, rows: list[int]) -> None:
        """Add what a scorer of the sample ``rows`` logged (a mixed run's source): its metric calls,
        and its columns spread to those rows (None on the others)."""
        for name, values in part._metrics.items():
            self._metrics[name].extend(values)
        for column, values in part.extra.items():
            full = self.extra.setdefault(column, [None] * self.size)
            for row, value in zip(rows, values, strict=True):
                full[row] = value

    def callbacks(self) -> dict[str, Any]:
        return {"log_extra": self.log_extra, "log_metric": self.log_metric}

    @property
    def metrics(self) -> dict[str, float]:
        """Each logged metric's mean over this batch's calls, as ``reward/<name>``."""
        return {f"reward/{name}": sum(v) / len(v) for name, v in sorted(self._metrics.items())}
