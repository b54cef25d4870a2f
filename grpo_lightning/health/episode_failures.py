"""Episode failures: environments that raise or time out (multi-turn episodes only).

A failed episode stays in its group with ``task.failed_reward`` and loss mask 0, so a run keeps
going; when many fail, the group statistics are made of placeholder rewards and little is
learned. The check averages the share of failed episodes (``rollout/episodes/failed``) over a
window of steps and alerts above ``max_failed_frac``, naming the kind of failure that dominates;
when every episode since the start failed it alerts at once, at the first step.
Single-turn runs report no episodes: the check stays silent.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, WindowCheckConfig, register_check
from grpo_lightning.health.view import StepView

PREFIX = "rollout/episodes/"  # the episode metrics of grpo_lightning.environments.rollout


def episode_counts(view: StepView, keys: tuple[str, ...]) -> dict[str, float]:
    """This rank's episode counts of the step (``count`` first), all 0 when the batch holds no episodes."""
    timing = view.rollout.timing
    return {key: float(timing.get(PREFIX + key, 0.0)) for key in ("count", *keys)}


class WindowedShareCheck(HealthCheck):
    """Alert when ``parts`` make up more than ``threshold`` of the episodes over a window of steps."""

    parts: tuple[str, ...] = ()
    early = False  # also alert before the window is full when every episode so far is one of ``parts``

    def __init__(self, cfg):
        super().__init__(cfg)
        self._window: deque[np.ndarray] = deque(maxlen=cfg.window)

    @property
    def threshold(self) -> float:
        raise NotImplementedError

    def measure(self, view: StepView) -> dict[str, float]:
        return episode_counts(view, self.parts)

    def shares(self, t: dict[str, float]) -> tuple[dict[str, float], float, dict[str, float] | None]:
        """This step's share per part, the window's total share, and the window's share per part
        (None until the window is full or while the share is under the threshold)."""
        if not t["count"]:
            return {}, 0.0, None
        self._window.append(np.array([t["count"], *(t[p] for p in self.parts)]))
        totals = np.sum(self._window, axis=0)
        window = {p: float(v / totals[0]) for p, v in zip(self.parts, totals[1:], strict=True)}
        share = sum(window.values())
        step = {f"{p}_frac": t[p] / t["count"] for p in self.parts}
        full = len(self._window) == self._window.maxlen or (self.early and share >= 1.0)
        return step, share, window if full and share > self.threshold else None


@dataclass
class EpisodeFailuresConfig(WindowCheckConfig):
    """Environments that raise or time out in many episodes."""

    window: int = option(10, "Steps over which the share of failed episodes is averaged.")
    max_failed_frac: float = option(0.2, "Alert when more than this share of the episodes failed (env error, timeout).")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, 0 <= self.max_failed_frac < 1, f"{p}max_failed_frac={self.max_failed_frac} must be in [0, 1)")
        return problems


@register_check(EpisodeFailuresConfig)
class EpisodeFailuresCheck(WindowedShareCheck):
    name = "episode_failures"
    failure = "episodes"
    title = "failing: environments raise or time out"  # (the alert reads "episodes failing: ...")
    parts = ("stop/env_error", "stop/step_timeout", "stop/episode_timeout")
    early = True  # every episode failed from the start: say so at once, before any reward-side check

    @property
    def threshold(self) -> float:
        return self.cfg.max_failed_frac

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        step, share, window = self.shares(t)
        if not step:
            return {}, None
        metrics = {"failed_frac": sum(step.values()), "failed_frac_window": share}
        if window is None:
            return metrics, None
        worst = max(window, key=window.get).removeprefix("stop/")
        evidence = (
            f"{share:.0%} of the episodes of the last {len(self._window)} steps failed (threshold "
            f"{self.cfg.max_failed_frac:.0%}), most of them by {worst} ({window['stop/' + worst]:.0%} of all episodes); "
            "they stay in their groups with task.failed_reward and add nothing to the loss"
        )
        return metrics, Finding(evidence + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the environment raises on some inputs (a model turn it cannot parse, a missing resource), or its "
            "reset/step is slower than task.step_timeout_s / task.episode_timeout_s allow."
        )
        fix = (
            "read the first failure of each kind, logged when it happened (train.log), or the errors of failed "
            "episodes (EpisodeRollout.last_episodes[i].error); make the environment "
            "answer bad turns with a message instead of raising; raise the timeouts if the work is legitimately slow."
        )
        return causes, fix
