"""``HealthCheck``: the interface every check implements.

A check reads a :class:`StepView` and returns *local* sums (``measure``); the monitor adds
them up over all ranks in one collective, so every rank then evaluates the same totals
(``evaluate``) and reaches the same verdict: a ``raise`` stops every rank together. Keep
the keys of ``measure`` fixed (the same on every rank and every step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_lightning.config.base import check, option
from grpo_lightning.config.health import HEALTH_CHECKS, PATIENCE_HELP, CheckConfig
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.view import StepView


@dataclass
class ExcessCheckConfig(CheckConfig):
    """Options of a duplicate-counting check (F1, F2)."""

    excess_ratio: float = option(
        3.0, "Alert when the samples with a duplicate exceed this multiple of the expected ..."
    )
    min_excess_frac: float = option(0.2, "... plus this fraction of the samples (a floor against chance).")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.excess_ratio >= 1, f"{p}excess_ratio={self.excess_ratio} must be >= 1")
        check(problems, 0 <= self.min_excess_frac < 1, f"{p}min_excess_frac={self.min_excess_frac} must be in [0, 1)")
        return problems


@dataclass
class WindowCheckConfig(CheckConfig):
    """Options of a check that averages over a window of steps."""

    patience: int = option(1, PATIENCE_HELP)
    window: int = option(20, "Steps the check averages over.")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.window >= 2, f"{p}window={self.window} must be >= 2")
        return problems


def register_check(options: type) -> Callable[[type[HealthCheck]], type[HealthCheck]]:
    """Register a check class under its ``name`` with its options dataclass: the config gets
    ``health.<name>.*`` and the monitor runs the check (one decorator, no central list)."""

    def decorate(cls: type[HealthCheck]) -> type[HealthCheck]:
        HEALTH_CHECKS.add(cls.name, cls, options=options)
        return cls

    return decorate


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
