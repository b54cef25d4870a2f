"""Reward signal: how many groups give GRPO nothing to learn from, over a window of steps.

A group whose rewards are all equal (tied, as :func:`grpo_lightning.algorithm.tied_groups`
defines it for the advantages too) has zero advantages and no gradient. Groups that are
all equal *at the best reward seen so far* are solved, which is fine (unless the reward has
never varied in the run); the check counts the others (stuck groups). When the rewards still vary between prompts (each reward function
has a spread over the batch) but not within groups, the samples of a group are likely
identical: F1's signature as the reward logs show it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from grpo_lightning.algorithm import rewards_equal, tied_groups
from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import PATIENCE_HELP, CheckConfig, HealthCheck, register_check
from grpo_lightning.health.episode_cuts import LIMITS, counts, is_episode_batch, worst_cut
from grpo_lightning.health.view import StepView

TRUNCATION_CAUSE_FRAC = 0.5  # above this share of cut completions, truncation leads the likely causes


@dataclass
class RewardSignalCheckConfig(CheckConfig):
    """Fraction of groups with zero reward std."""

    patience: int = option(1, PATIENCE_HELP)
    window: int = option(20, "Steps over which the fraction of stuck (zero-std, unsolved) groups is averaged.")
    max_stuck_frac: float = option(
        0.9, "Alert when more than this fraction of the groups had zero reward std below the best reward seen."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.window >= 1, f"{p}window={self.window} must be >= 1")
        check(problems, 0 <= self.max_stuck_frac <= 1, f"{p}max_stuck_frac={self.max_stuck_frac} must be in [0, 1]")
        return problems


@register_check(RewardSignalCheckConfig)
class RewardSignalCheck(HealthCheck):
    name = "reward_signal"
    failure = "F1/F4"
    title = "no reward signal: most groups have zero reward std"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._window: deque[np.ndarray] = deque(maxlen=cfg.window)  # (stuck, zero std, groups) per step
        self._sums = np.zeros(3)
        self._best = float("-inf")
        self._worst = float("inf")

    def measure(self, view: StepView) -> dict[str, float]:
        r = view.rollout
        grouped = r.rewards.detach().cpu().numpy().astype(np.float64).reshape(-1, r.group_size)
        means = grouped.mean(axis=1)
        flat = tied_groups(r.rewards, r.group_size).cpu().numpy()  # all equal: zero std
        self._best = max(self._best, float(means.max()))
        self._worst = min(self._worst, float(means.min()))
        # Solved: all equal at the best group reward of the run, provided rewards have ever
        # differed (a reward that never varies solves nothing).
        varied = not bool(rewards_equal(self._best, self._worst))
        at_best = (means >= self._best) | rewards_equal(means, self._best).numpy()
        stuck = flat & ~(at_best & varied)
        # A reward function "varies across the batch" unless the whole batch is one tied group.
        spread = sum(not bool(tied_groups(v, v.numel())) for v in r.reward_components.values())
        return {
            "groups": float(grouped.shape[0]),
            "zero_std": float(flat.sum()),
            "stuck": float(stuck.sum()),
            "components_spread": float(spread),
            "components": float(len(r.reward_components)),
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        if len(self._window) == self._window.maxlen:
            self._sums -= self._window[0]
        entry = np.array([t["stuck"], t["zero_std"], t["groups"]])
        self._window.append(entry)
        self._sums += entry
        stuck, zero, groups = self._sums[0], self._sums[1], max(self._sums[2], 1.0)
        metrics = {"stuck_frac": stuck / groups, "zero_std_frac": zero / groups}
        full = len(self._window) == self._window.maxlen
        if not (full and stuck / groups > self.cfg.max_stuck_frac):
            return metrics, None
        if not bool(rewards_equal(self._best, self._worst)):
            where = f" below the best group reward seen so far ({self._best:.3g})"
        else:
            where = f", and the reward has not varied once in this run (every group's mean is {self._best:.3g})"
        evidence = (
            f"over the last {len(self._window)} steps {zero / groups:.0%} of the groups had zero reward std, "
            f"{stuck / groups:.0%} of all groups stuck there{where} (threshold {self.cfg.max_stuck_frac:.0%})"
        )
        world = view.world_size
        if t["components"] and t["components_spread"] / world >= 1 and t["zero_std"] / max(t["groups"], 1) > 0.5:
            evidence += (
                f"; yet {t['components_spread'] / world:.0f} of {t['components'] / world:.0f} reward functions vary "
                f"across the batch this step: rewards differ between prompts but not within a group, the "
                f"signature of identical samples within a group (F1)"
            )
        return metrics, Finding(evidence + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the samples of a group are identical (see the diversity check: a sampler that ignores its seed), "
            "the task is too hard for the policy (every sample fails alike) or the reward too coarse "
            "(a pass/fail reward with no partial credit), or the policy is no longer changing (see the "
            "no_update check)."
        )
        fix = (
            f"check the diversity alert first; raise rollout.num_generations (now {view.group_size}) or "
            f"rollout.temperature (now {view.rollout.temperature:g}); add a partial-credit reward to "
            "task.rewards; use easier prompts at first (a curriculum)."
        )
        cut = view.clipped_frac
        if is_episode_batch(view.rollout):  # the limit that cut, not the episode horizon as max_new_tokens
            c = counts(view.rollout)
            limit = worst_cut(c, view.rollout.episode_limits)
            ended = sum(c[k] for k in LIMITS) / max(c["episodes"], 1.0)
            if limit is not None and (ended > TRUNCATION_CAUSE_FRAC or limit.limit == "turn_budget"):
                causes = f"{ended:.0%} of this step's episodes were ended by a limit: {limit.what}; or " + causes
                fix = f"{limit.fix}; " + fix
            return causes, fix
        if cut is not None and cut > TRUNCATION_CAUSE_FRAC:
            tokens = view.rollout.max_new_tokens
            causes = (
                f"{cut:.0%} of this step's completions were cut at rollout.max_new_tokens={tokens} before "
                f"finishing (see the truncation check), so most cannot hold a complete answer; or " + causes
            )
            fix = f"raise rollout.max_new_tokens (now {tokens}); " + fix
        return causes, fix
