"""Pipelined rollouts out of bounds (``rollout.mode=pipeline``, docs/pipeline.md): many finished groups
dropped as too stale, or the lagged tokens' log-probs far from the trainer's.

Over a window of steps the check adds up the groups the trainer took and those it dropped because a
token lagged beyond ``rollout.max_off_policy_steps`` (``pipeline/dropped_groups``), and the mean
|log pi_train - log pi_engine| of the tokens sampled by older weights (the ``by_lag`` mismatch totals,
token by token). It alerts when the dropped share exceeds ``max_dropped_frac`` (the generation spent
on them is lost) or the lagged tokens' gap exceeds ``max_lagged_logp_diff`` (their gradient is off
policy by that much), naming ``rollout.pipeline.max_lag`` and ``algorithm.corrections``. Silent in
the other modes (no pipeline metrics). F8 watches the lag-0 tokens' gap here and leaves the lagged
ones to this check.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from grpo_lightning.algorithm.mismatch import LAG_BUCKETS
from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, WindowCheckConfig, register_check
from grpo_lightning.health.view import StepView

PARTS = ("groups", "dropped", "lagged_tokens", "lagged_abs", "lag_max")


@dataclass
class PipelineLagConfig(WindowCheckConfig):
    """rollout.mode=pipeline: too many stale groups dropped, or lagged tokens far off policy."""

    window: int = option(10, "Steps over which dropped groups and the lagged tokens' gap are added up.")
    max_dropped_frac: float = option(
        0.2, "Alert when more than this share of the finished groups was dropped as stale."
    )
    max_lagged_logp_diff: float = option(
        0.1, "Alert when the lagged tokens' mean |log pi_train - log pi_engine| exceeds this."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(
            problems, 0 <= self.max_dropped_frac < 1, f"{p}max_dropped_frac={self.max_dropped_frac} must be in [0, 1)"
        )
        check(
            problems, self.max_lagged_logp_diff > 0, f"{p}max_lagged_logp_diff={self.max_lagged_logp_diff} must be > 0"
        )
        return problems


@register_check(PipelineLagConfig)
class PipelineLagCheck(HealthCheck):
    name = "pipeline_lag"
    failure = "pipeline"
    title = "pipelined rollouts lag too far"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._window: deque[np.ndarray] = deque(maxlen=cfg.window)
        self.reason = ""

    def measure(self, view: StepView) -> dict[str, float]:
        timing, totals = view.rollout.timing, view.result.mismatch or {}
        if "pipeline/lag_max" not in timing:
            return dict.fromkeys(PARTS, 0.0)
        buckets = [name for _, _, name in LAG_BUCKETS]
        return {
            "groups": float(view.rollout.num_sequences // view.rollout.group_size),
            "dropped": float(timing.get("pipeline/dropped_groups", 0.0)),
            "lagged_tokens": sum(float(totals.get(f"by_lag{b}_tokens", 0.0)) for b in buckets),
            "lagged_abs": sum(float(totals.get(f"by_lag{b}_abs_dlogp", 0.0)) for b in buckets),
            "lag_max": float(timing["pipeline/lag_max"]),
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        if not t["groups"]:
            return {}, None
        self._window.append(np.array([t[p] for p in PARTS[:4]]))
        groups, dropped, tokens, gap = np.sum(self._window, axis=0)
        dropped_frac = dropped / (groups + dropped)
        lagged_gap = gap / tokens if tokens else 0.0
        metrics = {"dropped_frac_window": float(dropped_frac), "lagged_abs_logp_diff_window": float(lagged_gap)}
        if len(self._window) < self._window.maxlen:
            return metrics, None
        found = []
        if dropped_frac > self.cfg.max_dropped_frac:
            found.append(
                f"{dropped_frac:.0%} of the finished groups of the last {len(self._window)} steps were dropped as "
                f"staler than rollout.max_off_policy_steps (threshold {self.cfg.max_dropped_frac:.0%})"
            )
        if lagged_gap > self.cfg.max_lagged_logp_diff:
            found.append(
                f"the tokens sampled by older weights differ from the trainer's log-probs by {lagged_gap:.3f} on "
                f"mean (threshold {self.cfg.max_lagged_logp_diff}; largest lag this step {t['lag_max']:.0f})"
            )
        if not found:
            return metrics, None
        self.reason = "dropped" if dropped_frac > self.cfg.max_dropped_frac else "gap"
        return metrics, Finding("; ".join(found) + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the producer runs too far ahead of the trainer: long completions finish several optimizer steps after "
            "they started, so their tokens come from weights the trainer has moved away from (fast-moving weights, "
            "a high learning rate, long tails of completion lengths)."
        )
        fix = (
            "lower rollout.pipeline.max_lag (or rollout.pipeline.max_in_flight); "
            + (
                "raise rollout.max_off_policy_steps, or set rollout.off_policy_action=mask to keep the fresh tokens"
                if self.reason == "dropped"
                else "correct the lagged tokens (algorithm.corrections=[tis_token] or [icepop], docs/corrections.md)"
            )
            + "; or use rollout.mode=sync."
        )
        return causes, fix
