"""Completions that tried to game a reward: the policy is learning to attack its reward source.

A reward source that sees an attempt it defeats (code_tests: a value whose ``==`` lies, a
program that exits or patches the runtime; the judge: a completion that writes its own score)
scores it as it deserves and counts it by name in ``reward/<source>/hacks/<name>``, with the
completions of the batch that tried anything in ``reward/<source>/hacks``. Each attempt is
defeated, so the rewards stay honest, but a rising share means the policy found that trying pays
sometimes (a weaker sandbox, a gullible judge) or soon will: the check alerts when more than
``max_frac`` of the completions of the last ``window`` steps tried, naming what they tried.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, WindowCheckConfig, register_check
from grpo_lightning.health.view import StepView


def hack_counts(metrics: dict[str, float]) -> tuple[float, dict[str, int]]:
    """Completions that tried (``reward/<source>/hacks`` summed) and the count of each named attempt."""
    total, named = 0.0, Counter()
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "reward" and parts[2] == "hacks":
            total += value
        elif len(parts) == 4 and parts[0] == "reward" and parts[2] == "hacks":
            named[f"{parts[1]}: {parts[3]}"] += int(value)
    return total, dict(named)  # plain data: a check's state goes into checkpoints


@dataclass
class RewardHacksConfig(WindowCheckConfig):
    """Completions that tried to game a reward source (reward/<source>/hacks)."""

    window: int = option(5, "Steps over which the share of completions that tried is averaged.")
    max_frac: float = option(0.02, "Alert when more than this share of the completions tried to game a reward.")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, 0 <= self.max_frac < 1, f"{p}max_frac={self.max_frac} must be in [0, 1)")
        return problems


@register_check(RewardHacksConfig)
class RewardHacksCheck(HealthCheck):
    name = "reward_hacks"
    failure = "F6"
    title = "completions try to game a reward source"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._window: deque[tuple[float, float]] = deque(maxlen=cfg.window)
        self._named: deque[dict[str, int]] = deque(maxlen=cfg.window)  # this rank's, for the evidence

    def measure(self, view: StepView) -> dict[str, float]:
        total, named = hack_counts(view.rollout.reward_metrics)
        self._named.append(named)
        return {"tried": total, "completions": float(len(view.rollout.rewards))}

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        if not t["completions"]:
            return {}, None
        self._window.append((t["tried"], t["completions"]))
        tried, completions = (sum(v) for v in zip(*self._window, strict=True))
        metrics = {"tried_frac": t["tried"] / t["completions"], "tried_frac_window": tried / completions}
        if tried / completions <= self.cfg.max_frac:
            return metrics, None
        named = sum((Counter(n) for n in self._named), Counter()).most_common(4)
        what = ", ".join(f"{name} ({count})" for name, count in named) or "see reward/<source>/hacks/*"
        evidence = (
            f"{tried:.0f} of the {completions:.0f} completions of the last {len(self._window)} steps tried to game "
            f"a reward (threshold {self.cfg.max_frac:.0%}): {what}; each attempt was scored as a failure"
        )
        return metrics, Finding(evidence + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the policy found (or is searching for) a way to score without solving the task: the rewarded "
            "completions of its groups include attempts, or a weaker setting let some through (code_tests without "
            "namespaces: docs/security.md)."
        )
        fix = (
            "read the completions that tried (completions.jsonl); keep rewards.code_tests.isolate=true; give the "
            "judge a rubric that ignores instructions inside the completion; a small penalty reward for attempts "
            "teaches the policy to stop."
        )
        return causes, fix
