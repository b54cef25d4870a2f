"""F3 (the aftermath): degenerate output and entropy collapse.

A completion made of one token repeated (``!!!!!!!!``) is what a policy emits after a
non-finite update or a collapse; a policy whose per-token entropy at the sampling
temperature is near zero produces identical groups, so GRPO has no signal left.

Entropy collapse is also judged against the run's own start: the mean entropy of the first
``entropy_baseline_steps`` steps is the baseline, and an entropy below
``entropy_collapse_ratio`` of it alerts when the task's correctness reward
(``task.correctness_reward``; the total reward without one), averaged over the same number
of recent steps, fell below its own baseline by more than two standard errors
(``sqrt(p (1 - p) / n)`` of each mean, rewards in [0, 1]) or is exactly 0. A policy that
gets sharper because it solves the task is not flagged (the default demo: entropy 2.9 ->
0.9 nats while accuracy rises; the SmolLM2 example of docs/real_tasks.md: 1.9 -> 0.26
nats, 15% of its start, by step 14 while the correctness reward rose from 0.20 to about
0.5): entropy alone cannot tell learning from collapse. One that collapses from 2.2 to 0.4
nats while correctness falls to zero is flagged.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import PATIENCE_HELP, CheckConfig, HealthCheck, register_check
from grpo_lightning.health.view import StepView


@dataclass
class DegenerateCheckConfig(CheckConfig):
    """F3: one-token-repeated completions, entropy collapse."""

    patience: int = option(3, PATIENCE_HELP)
    min_tokens: int = option(4, "F3: a completion of at least this many copies of one token (EOS aside) is degenerate.")
    max_degenerate_frac: float = option(0.5, "F3: alert when more than this fraction of the completions is degenerate.")
    min_entropy: float = option(1e-3, "F3: alert when the policy's mean per-token entropy (nats) falls below this.")
    entropy_collapse_ratio: float = option(
        0.25, "Also alert when entropy falls below this fraction of its start while correctness fell or is 0."
    )
    entropy_baseline_steps: int = option(
        5, "Steps whose mean entropy and correctness are the run's start (and the recent correctness window)."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(
            problems,
            0 < self.entropy_collapse_ratio < 1,
            f"{p}entropy_collapse_ratio={self.entropy_collapse_ratio} must be in (0, 1)",
        )
        check(
            problems,
            self.entropy_baseline_steps >= 1,
            f"{p}entropy_baseline_steps={self.entropy_baseline_steps} must be >= 1",
        )
        check(problems, self.min_tokens >= 2, f"{p}min_tokens={self.min_tokens} must be >= 2")
        return problems


@register_check(DegenerateCheckConfig)
class DegenerateOutputCheck(HealthCheck):
    name = "degenerate"
    failure = "F3"
    title = "degenerate output or entropy collapse"

    def __init__(self, cfg):
        super().__init__(cfg)
        n = cfg.entropy_baseline_steps
        self._baseline: list[tuple[float, float, float]] = []  # (entropy, correct sum, samples) of the first n steps
        self._recent: deque[tuple[float, float]] = deque(maxlen=n)  # (correct sum, samples) of the last n steps

    def measure(self, view: StepView) -> dict[str, float]:
        ids, mask = view.completion_ids, view.completion_mask
        finished = view.rollout.finished
        lengths = mask.sum(axis=1) - (finished.cpu().numpy().astype(np.int64) if finished is not None else 0)
        inside = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        one_token = ((ids == ids[:, :1]) | ~inside).all(axis=1)
        degenerate = (lengths >= self.cfg.min_tokens) & one_token
        last = view.result.passes[-1] if view.result.passes else None
        components = view.rollout.reward_components
        scores = components.get(view.correctness_reward, view.rollout.rewards) if components else view.rollout.rewards
        return {
            "correct_sum": float(scores.detach().double().sum()),
            "degenerate": float(degenerate.sum()),
            "sequences": float(len(ids)),
            "entropy_sum": float(last.entropy_sum) if last else 0.0,
            "entropy_tokens": float(last.kept_tokens) if last else 0.0,
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        frac = t["degenerate"] / max(t["sequences"], 1.0)
        entropy = t["entropy_sum"] / t["entropy_tokens"] if t["entropy_tokens"] else float("nan")
        metrics = {"frac": frac, "entropy": entropy}
        degenerate = frac > self.cfg.max_degenerate_frac
        collapsed = t["entropy_tokens"] > 0 and entropy < self.cfg.min_entropy
        relative = ""
        if t["entropy_tokens"] > 0:
            if len(self._baseline) < self.cfg.entropy_baseline_steps:
                self._baseline.append((entropy, t["correct_sum"], t["sequences"]))
            self._recent.append((t["correct_sum"], t["sequences"]))
            base_entropy = float(np.mean([b[0] for b in self._baseline]))
            base_correct, base_n = _mean_and_count([b[1:] for b in self._baseline])
            recent_correct, recent_n = _mean_and_count(self._recent)
            metrics["entropy_vs_start"] = entropy / base_entropy if base_entropy > 0 else float("nan")
            stderr = np.sqrt(_var(base_correct) / base_n + _var(recent_correct) / recent_n)
            worse = recent_correct == 0.0 or base_correct - recent_correct > 2 * stderr
            if (
                len(self._baseline) == self.cfg.entropy_baseline_steps
                and entropy < self.cfg.entropy_collapse_ratio * base_entropy
                and worse
            ):
                collapsed = True
                relative = (
                    f" The entropy fell to {entropy / base_entropy:.0%} of the run's start ({base_entropy:.3f} nats, "
                    f"threshold {self.cfg.entropy_collapse_ratio:.0%}) while the correctness reward fell or stayed at zero "
                    f"({base_correct:.3f} at the start, {recent_correct:.3f} over the last {len(self._recent)} steps)."
                )
        if not (degenerate or collapsed):
            return metrics, None
        example = ""
        if degenerate and view.rollout.completions:
            ids, mask = view.completion_ids, view.completion_mask
            rows = [
                i
                for i in range(len(ids))
                if mask[i].sum() >= self.cfg.min_tokens and (ids[i][mask[i]] == ids[i][0]).all()
            ]
            if rows:
                example = f" (e.g. {view.rollout.completions[rows[0]]!r})"
        evidence = (
            f"{frac:.0%} of the completions are one token repeated at least {self.cfg.min_tokens} times{example} "
            f"(threshold {self.cfg.max_degenerate_frac:.0%}); policy entropy {entropy:.4f} nats per token "
            f"(threshold {self.cfg.min_entropy:g}).{relative}"
        )
        return metrics, Finding(evidence, {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        a = view.algorithm
        causes = (
            "the policy collapsed onto a single token or answer: often right after a non-finite or oversized "
            "update (see the nonfinite check), a learning rate too high, or no KL anchor; at near-zero "
            "entropy every sample of a group is alike and GRPO stops learning."
        )
        fix = (
            f"lower algorithm.lr (now {a.lr:g}); raise algorithm.beta (now {a.beta:g}) to hold the policy near "
            f"its reference; raise rollout.temperature (now {view.rollout.temperature:g}); resume from a "
            "checkpoint taken before the collapse."
        )
        return causes, fix


def _mean_and_count(sums_and_counts) -> tuple[float, float]:
    """Mean and sample count of (sum, count) pairs."""
    total = sum(c for _, c in sums_and_counts)
    return (sum(v for v, _ in sums_and_counts) / total if total else 0.0), max(total, 1.0)


def _var(p: float) -> float:
    """Variance bound of a [0, 1] reward with mean p (Bernoulli's p (1 - p))."""
    p = min(max(p, 0.0), 1.0)
    return p * (1.0 - p)
