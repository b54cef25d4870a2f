"""Learning-rate schedules: a linear warm-up, then constant, linear or cosine decay.

The factor multiplies ``algorithm.lr`` at optimizer step ``step`` (0-based, the step about to
be taken), as ``torch.optim.lr_scheduler.LambdaLR`` applies it:

- warm-up (``step < warmup``): ``(step + 1) / (warmup + 1)``;
- after it, with ``p = (step - warmup) / (total - warmup)`` clamped to [0, 1]:
  ``constant``: 1; ``linear``: ``1 - p``; ``cosine``: ``(1 + cos(pi p)) / 2`` (both reach 0
  at ``total``; a ``total`` <= 0 means no horizon, no decay; HF's ``get_linear_schedule_with_warmup`` / ``get_cosine_schedule_with_warmup``).
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, schedule: str, warmup: int, total: int) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` of ``total``."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"algorithm.lr_schedule={schedule!r} is not one of {LR_SCHEDULES}")
    if warmup > 0 and step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant" or total <= 0:  # no horizon known (no Trainer): no decay
        return 1.0
    progress = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
