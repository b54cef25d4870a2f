"""Reward hacking: the policy learns the shaping rewards instead of the task.

A run can look healthy on its total reward while it gets worse at the task: the format
reward is learned within a few steps, the correctness reward falls (or never leaves zero),
and the held-out accuracy drops below its value before training. The check watches both:

1. **Training rewards**, over a window of ``window`` steps split into an early and a late
   half: an alert when a shaping component (every reward function except
   ``task.correctness_reward``) rose by more than ``min_rise`` and by more than two standard
   errors, while the correctness component fell by more than ``min_fall`` and two standard
   errors, or was exactly zero on every sample of the window.
2. **Held-out accuracy** (``val/accuracy``, greedy): an alert when a validation scores below
   the best one so far (the first one, the pre-training baseline with ``eval.before_training``,
   when nothing beat it; only the first one with ``val_from_best=false``) by more than two
   standard errors of the difference, ``sqrt(pb (1 - pb) / nb + p (1 - p) / n)``; once per
   fall (again only after a validation within two standard errors of that reference). A run
   past its peak (SmolLM2 on reasoning-gym gcd: 0.183 -> 0.450 at step 10 -> 0.200 at step 30)
   never falls below its start, but its best checkpoint is behind it.

Standard errors of a half-window mean are those of its samples' values (their std over
sqrt(count)), so a rise the size of the sampling noise never alerts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from grpo_lightning.config.base import option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, WindowCheckConfig, register_check
from grpo_lightning.health.view import StepView


@dataclass
class RewardHackingCheckConfig(WindowCheckConfig):
    """Shaping rewards rising while correctness falls or stays 0; held-out accuracy falls."""

    window: int = option(20, "Steps compared as an early and a late half (training rewards).")
    min_rise: float = option(0.1, "A shaping reward 'rises' when its mean gained more than this (and two std errors).")
    min_fall: float = option(
        0.05, "Correctness 'falls' when its mean lost more than this (and two std errors), or is 0 throughout."
    )
    val_from_best: bool = option(
        True, "Held-out accuracy alerts below the best validation so far; false: below the first one only."
    )


@register_check(RewardHackingCheckConfig)
class RewardHackingCheck(HealthCheck):
    name = "reward_hacking"
    failure = "F6"
    title = "reward hacking: shaping rewards rise while the task's correctness does not"

    def __init__(self, cfg):
        super().__init__(cfg)
        # per step: component -> (sum, sum of squares, count)
        self._window: deque[dict[str, tuple[float, float, float]]] = deque(maxlen=cfg.window)
        # (accuracy, prompts, step) of the first held-out validation, and of the best one so far
        self._baseline: tuple[float, int, int] | None = None
        self._best: tuple[float, int, int] | None = None
        # what the last training batch tells a held-out alert (plain data, saved in checkpoints)
        self._last_batch: dict | None = None
        self._val_alerted = False

    # ----------------------------------------------------------------------- training rewards
    def measure(self, view: StepView) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, values in sorted(view.rollout.reward_components.items()):
            v = values.detach().cpu().double()
            out[f"{name}/sum"], out[f"{name}/sq"], out[f"{name}/n"] = (
                float(v.sum()),
                float((v * v).sum()),
                float(v.numel()),
            )
        return out

    @staticmethod
    def _half(entries, name: str) -> tuple[float, float, float]:
        """Mean, standard error of the mean, and the sum of squares (0 iff every value is 0) over ``entries``."""
        s = sum(e[name][0] for e in entries)
        sq = sum(e[name][1] for e in entries)
        n = max(sum(e[name][2] for e in entries), 1.0)
        mean = s / n
        var = max(sq / n - mean * mean, 0.0)
        return mean, math.sqrt(var / n), sq

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        self._last_batch = _batch_summary(view)
        names = sorted({key.rsplit("/", 1)[0] for key in t})
        self._window.append({name: (t[f"{name}/sum"], t[f"{name}/sq"], t[f"{name}/n"]) for name in names})
        correct = view.correctness_reward
        if correct not in names or len(names) < 2 or len(self._window) < self._window.maxlen:
            return {}, None
        half = len(self._window) // 2
        early, late = list(self._window)[:half], list(self._window)[-half:]
        trends = {}
        for name in names:
            (m0, se0, _), (m1, se1, _) = self._half(early, name), self._half(late, name)
            trends[name] = (m0, m1, math.sqrt(se0**2 + se1**2))
        c0, c1, c_se = trends[correct]
        metrics = {"correctness_trend": c1 - c0}
        always_zero = all(self._half([e], correct)[2] == 0.0 for e in self._window)
        fell = c0 - c1 > max(self.cfg.min_fall, 2 * c_se)
        rising = [
            name
            for name, (m0, m1, se) in trends.items()
            if name != correct and m1 - m0 > max(self.cfg.min_rise, 2 * se)
        ]
        metrics["shaping_rising"] = float(len(rising))
        if not rising or not (fell or always_zero):
            return metrics, None
        shaping = ", ".join(f"'{n}' rose {trends[n][0]:.3f} -> {trends[n][1]:.3f}" for n in rising)
        if always_zero:
            task = f"the correctness reward '{correct}' was 0 on every sample of the last {len(self._window)} steps"
        else:
            task = f"the correctness reward '{correct}' fell {c0:.3f} -> {c1:.3f} (more than 2 standard errors, {2 * c_se:.3f})"
        evidence = (
            f"over the last {len(self._window)} steps (first half -> second half) {shaping}, while {task}: "
            f"the policy is learning the shaping, not the task"
        )
        return metrics, Finding(evidence + ".", {**metrics, "correctness_early": c0, "correctness_late": c1})

    # ----------------------------------------------------------------------- held-out accuracy
    def observe_validation(self, accuracy: float, prompts: int, step: int) -> Finding | None:
        """The first call records the baseline; later ones alert on a fall beyond two standard errors
        below the best validation so far (or the baseline only, with ``val_from_best=false``)."""
        if self._baseline is None:
            self._baseline = self._best = (accuracy, prompts, step)
            return None
        p0 = self._baseline[0]
        pb, nb, best_step = self._best if self.cfg.val_from_best else self._baseline
        from_peak = best_step != self._baseline[2]
        se = _difference_stderr(pb, nb, accuracy, prompts)
        fallen = pb - accuracy > 2 * se and pb > accuracy
        alerted, self._val_alerted = self._val_alerted, fallen
        if accuracy > self._best[0]:
            self._best = (accuracy, prompts, step)
        if not fallen or alerted:  # once per fall: again only after a recovery
            return None
        if from_peak:
            source = f"its best, {pb:.3f} at step {best_step} ({nb} prompts; {p0:.3f} before training)"
        else:
            source = f"{pb:.3f} before training ({nb} prompts)"
        evidence = (
            f"held-out accuracy (val/accuracy, greedy) fell from {source} to "
            f"{accuracy:.3f} at step {step} ({prompts} prompts), a drop of {pb - accuracy:.3f}, more than two "
            f"standard errors ({2 * se:.3f})"
        )
        if from_peak:
            evidence += (
                f"; the policy is past its peak: the checkpoint of step {best_step} is the one to keep "
                "(trainer.checkpoint_every_n_steps at a divisor of eval.every_n_steps saves it)"
            )
        if self._last_batch is not None:
            parts = self._component_means(self._last_batch["reward_components"])
            if parts:
                evidence += f"; the last training batch's reward components: {parts}"
        values = {"val_accuracy_before": p0, "val_accuracy_reference": pb, "val_accuracy": accuracy, "stderr": se}
        return Finding(evidence + ".", values)

    @staticmethod
    def _component_means(components: dict) -> str:
        return ", ".join(f"{n} {float(v.float().mean()):.3f}" for n, v in sorted(components.items()))

    def diagnosis(self, view: StepView | None) -> tuple[str, str]:
        seen = _batch_summary(view) if view is not None else self._last_batch
        weights = seen["reward_weights"] if seen is not None else {}
        correct = seen["correctness_reward"] if seen is not None else None
        shaping = [f"task.rewards.{n} (now {w:g})" for n, w in weights.items() if n != correct]
        causes = (
            "the shaping rewards (format, length) are easier to earn than correctness and outweigh it, so GRPO "
            "optimizes them and the answers get worse; or the completions are too short to reach a correct answer "
            "(see the truncation check); or the learning rate moves the policy away from what it could solve. "
            "Entropy usually collapses alongside (see the degenerate check)."
        )
        lr = f" (now {seen['lr']:g})" if seen is not None else ""
        tokens = f" (now {seen['max_new_tokens']})" if seen is not None else ""
        fix = (
            f"lower the shaping weight{'s' if len(shaping) > 1 else ''} ({', '.join(shaping) or 'task.rewards'}) "
            f"relative to the correctness reward; raise rollout.max_new_tokens{tokens}; lower algorithm.lr{lr}; "
            "evaluate more often (fewer eval.every_n_steps) to see the fall early and keep the checkpoint before it."
        )
        return causes, fix


def _batch_summary(view: StepView) -> dict:
    """The parts of a step's view that the held-out alert and the diagnosis read."""
    return {
        "reward_components": dict(view.rollout.reward_components),
        "reward_weights": dict(view.reward_weights),
        "correctness_reward": view.correctness_reward,
        "lr": view.lr,
        "max_new_tokens": view.rollout.max_new_tokens,
    }


def _difference_stderr(p1: float, n1: int, p2: float, n2: int) -> float:
    """Standard error of the difference of two independent accuracies (Bernoulli variances)."""
    return math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
