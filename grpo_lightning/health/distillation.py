"""On-policy distillation's two failures (``algorithm.teacher``): the teacher-student KL does not
fall, and the student's reward falls while the KL falls.

Both compare the run's first ``window`` steps with its latest ``window`` (once ``2 x window``
steps ran, so the two do not overlap) of ``distill/kl`` (the k1 estimate of KL(student || teacher)
per token on the student's samples, over every rank) and of the reward: the correctness reward's
score when the task names one (``task.correctness_reward``), else the weighted reward, else (every
weight 0: pure distillation) the mean of the reward functions' scores.

- ``distill_kl``: the KL has not fallen by ``min_drop`` of its start. The student is not moving
  towards the teacher: the teacher and the student see different prompts (another chat template or
  system prompt; a context teacher's prefix that changes nothing), the wrong teacher (another task, a
  base model), a learning rate too small to move or so large that it oscillates, or a teacher weight
  drowned by the reward term.
- ``distill_reward``: the KL fell by ``min_kl_drop`` and the reward fell by ``min_reward_drop``
  (absolute): the student is becoming the teacher and the teacher is worse at this task.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, WindowCheckConfig, register_check
from grpo_lightning.health.view import StepView


def reward_signal(view: StepView) -> tuple[float, float]:
    """(sum, count) of the reward this module watches (see the module doc) over this rank's samples."""
    r = view.rollout
    components = r.reward_components
    if view.correctness_reward in components:
        values = components[view.correctness_reward].detach().double().cpu().numpy()
    elif any(w != 0 for w in view.reward_weights.values()) or not components:
        values = r.rewards.detach().double().cpu().numpy()
    else:
        values = np.nanmean(np.stack([v.detach().double().cpu().numpy() for v in components.values()]), axis=0)
    values = values[~np.isnan(values)]
    return float(values.sum()), float(values.size)


class DistillWindowCheck(HealthCheck):
    """What both checks share: the KL and the reward of each step, in the run's first and latest windows
    (plain data, as a checkpoint keeps a check's state)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self._steps = 0
        self._first: dict[str, float] = {}  # the means of the run's first ``window`` steps
        self._recent: deque[dict[str, float]] = deque(maxlen=cfg.window)

    def means(self, key: str) -> tuple[float, float]:
        """(the first window's mean, the latest window's mean) of ``key``."""
        return self._first[key], float(np.mean([v[key] for v in self._recent]))

    def kl_drop(self) -> tuple[float, float, float]:
        """The KL's first and latest window means, and the share of the first by which it fell."""
        first, recent = self.means("kl")
        return first, recent, (first - recent) / first if first > 0 else 0.0

    def measure(self, view: StepView) -> dict[str, float]:
        kl = view.result.metrics.get("distill/kl")
        if kl is None:  # no teacher: nothing to read (the same keys on every rank)
            return {"kl": 0.0, "present": 0.0, "reward": 0.0, "n": 0.0}
        reward, n = reward_signal(view)
        return {"kl": float(kl), "present": 1.0, "reward": reward, "n": n}

    def add(self, t: dict[str, float], view: StepView) -> dict[str, float] | None:
        """Record this step's KL (the same on every rank: its mean over ranks) and mean reward; they are
        returned once both windows are full (None before, and without a teacher)."""
        if t["present"] < view.world_size:
            return None
        values = {"kl": t["kl"] / view.world_size, "reward": t["reward"] / max(t["n"], 1.0)}
        size = self.cfg.window
        if self._steps < size:
            for key, value in values.items():
                self._first[key] = self._first.get(key, 0.0) + value / size
        self._recent.append(values)
        self._steps += 1
        return values if self._steps >= 2 * size else None


@dataclass
class DistillKLCheckConfig(WindowCheckConfig):
    """Distillation: the teacher-student KL does not fall."""

    window: int = option(20, "Steps of each window: the run's first and its latest (compared once 2 x window ran).")
    min_drop: float = option(0.1, "Alert when distill/kl fell by less than this share of its first window's mean.")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, 0 < self.min_drop < 1, f"{p}min_drop={self.min_drop} must be in (0, 1)")
        return problems


@register_check(DistillKLCheckConfig)
class DistillKLCheck(DistillWindowCheck):
    name = "distill_kl"
    failure = "D1"
    title = "distillation: the teacher-student KL does not fall"

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        values = self.add(t, view)
        if values is None:
            return {}, None
        first, recent, drop = self.kl_drop()
        metrics = {"kl_first": first, "kl_recent": recent, "kl_drop": drop}
        if drop >= self.cfg.min_drop:
            return metrics, None
        size = self.cfg.window
        evidence = (
            f"distill/kl (KL(student || teacher) per token) was {recent:.4g} over the last {size} steps against "
            f"{first:.4g} over the run's first {size}: it fell by {drop:.0%}, less than the {self.cfg.min_drop:.0%} "
            "expected of a student learning from its teacher"
        )
        if first < 1e-3:
            evidence += "; it was near 0 from the start: the teacher scores the student's tokens as the student does"
        return metrics, Finding(evidence + ".", {**values, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the teacher and the student see different prompts (another chat template or system prompt, a context "
            "teacher's prefix that changes nothing), the wrong teacher (another task, a base model, the student "
            "itself), a learning rate too small to move the student or so large that it oscillates, or a teacher "
            "weight drowned by the reward term."
        )
        fix = (
            f"compare the prompt the teacher sees with the student's (completions.jsonl); check "
            f"algorithm.teacher.path / kind; try another algorithm.lr (now {view.lr:g}); raise "
            "algorithm.teacher.weight or lower the reward weights."
        )
        return causes, fix


@dataclass
class DistillRewardCheckConfig(WindowCheckConfig):
    """Distillation: the student's reward falls while the KL to the teacher falls."""

    window: int = option(20, "Steps of each window: the run's first and its latest (compared once 2 x window ran).")
    min_kl_drop: float = option(0.1, "The KL counts as falling when it fell by this share of its first window's mean.")
    min_reward_drop: float = option(
        0.05, "Alert when the reward's mean fell by at least this much (absolute) meanwhile."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, 0 < self.min_kl_drop < 1, f"{p}min_kl_drop={self.min_kl_drop} must be in (0, 1)")
        check(problems, self.min_reward_drop > 0, f"{p}min_reward_drop={self.min_reward_drop} must be > 0")
        return problems


@register_check(DistillRewardCheckConfig)
class DistillRewardCheck(DistillWindowCheck):
    name = "distill_reward"
    failure = "D2"
    title = "distillation: the reward falls while the student nears the teacher"

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        values = self.add(t, view)
        if values is None:
            return {}, None
        (kl_first, kl_recent, kl_drop), (r_first, r_recent) = self.kl_drop(), self.means("reward")
        metrics = {"reward_first": r_first, "reward_recent": r_recent}
        if kl_drop < self.cfg.min_kl_drop or r_first - r_recent < self.cfg.min_reward_drop:
            return metrics, None
        size = self.cfg.window
        evidence = (
            f"over the run's first {size} steps and its last {size}, distill/kl fell {kl_first:.4g} -> {kl_recent:.4g} "
            f"({kl_drop:.0%}) while the reward fell {r_first:.4g} -> {r_recent:.4g}: the student is becoming the "
            "teacher, and the teacher does worse at this task"
        )
        return metrics, Finding(evidence + ".", {**values, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the teacher is wrong for this task (trained on another one, or on another answer format), a context "
            "teacher's prompt misleads it, or the reward checks a format the teacher does not write."
        )
        fix = (
            "score the teacher alone on the task (its own accuracy); use a teacher trained for it; give the rewards "
            "more weight against algorithm.teacher.weight, or stop distilling once the KL is low."
        )
        return causes, fix
