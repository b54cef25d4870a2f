"""What a health check reports: a ``Finding`` (this step looks wrong) and an ``Alert`` (it kept
looking wrong for ``patience`` steps, so the user is told what failed, why, and what to change)."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_lightning.errors import TrainingStopped

ACTIONS = ("warn", "raise", "ignore")


class HealthWarning(UserWarning):
    """Category of the rank-zero warnings a health check emits (filter or escalate them by it)."""


class HealthCheckError(TrainingStopped):
    """Training stopped by a health check whose action is ``raise``; the message is the diagnosis
    (a stop by design, not the user's input: not a :class:`~grpo_lightning.errors.UserError`)."""

    def __init__(self, alert: Alert):
        super().__init__(alert.text)
        self.alert = alert


@dataclass
class Finding:
    """One step's evidence that something is wrong: plain words plus the numbers behind them."""

    evidence: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    """A diagnosis as the user sees it: the failure, the evidence, likely causes, what to try."""

    check: str
    failure: str
    title: str
    step: int
    evidence: str
    causes: str
    fix: str
    values: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return (
            f"[grpo_lightning health] {self.failure} {self.title} (check '{self.check}', step {self.step})\n"
            f"  Evidence: {self.evidence}\n"
            f"  Likely causes: {self.causes}\n"
            f"  Try: {self.fix}"
        )

    def __str__(self) -> str:
        return self.text
