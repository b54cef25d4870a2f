"""``HealthCheck``: the interface every check implements.

A check reads a :class:`StepView` and returns *local* sums (``measure``); the monitor adds
them up over all ranks in one collective, so every rank then evaluates the same totals
(``evaluate``) and reaches the same verdict: a ``raise`` stops every rank together. Keep
the keys of ``measure`` fixed (the same on every rank and every step).
"""

from __future__ import annotations

import torch

from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.view import StepView


class HealthCheck:
    name: str = ""  # the config field and the metric namespace: health/<name>/...
    failure: str = ""  # the failure it watches for, e.g. "F1"
    title: str = ""  # the failure in a few words
    announced: str | None = None  # a once-per-run line the monitor logs (set by a check that has one)

    def __init__(self, cfg):
        self.cfg = cfg

    @property
    def action(self) -> str:
        return self.cfg.action

    @property
    def patience(self) -> int:
        return self.cfg.patience

    def before_step(self, policy: torch.nn.Module) -> None:
        """Called before the training step with the policy (e.g. to snapshot its weights)."""

    def observe_validation(self, accuracy: float, prompts: int, step: int) -> Finding | None:
        """Held-out accuracy after a validation run (over ``prompts`` prompts); a finding if it looks wrong."""
        return None

    def measure(self, view: StepView) -> dict[str, float]:
        """This rank's sums for this step; summed over ranks before ``evaluate``."""
        raise NotImplementedError

    def evaluate(self, totals: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        """Metrics to log (without the health/<name>/ prefix) and a finding if the step looks wrong."""
        raise NotImplementedError

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        """(likely causes, the config change to try), in plain words."""
        raise NotImplementedError


def excess(observed: float, expected: float, possible: float, ratio: float, min_excess_frac: float) -> bool:
    """More duplicates than the policy's own probabilities explain, by a wide margin.

    ``observed`` must exceed ``ratio`` times the ``expected`` count plus ``min_excess_frac`` of
    the ``possible`` count: chance fluctuations of a healthy sampler stay far below both.
    """
    return possible > 0 and observed > ratio * expected + min_excess_frac * possible
