"""Truncation: most completions are cut at ``rollout.max_new_tokens`` (no EOS).

A cut completion rarely holds a complete, well-formed answer, so its reward is usually 0;
when most are cut, the reward sits at zero and the run learns nothing. It is the most
common cause of "reward stuck at zero" reports. The check averages the share of cut
completions (``completions/clipped_ratio``) over a window of steps and alerts above
``max_clipped_frac``, with the rewards of cut and finished completions side by side. Episode
tasks are left to the ``episode_limits`` check, which names the limit that ended the episodes
(an episode's budget is not ``rollout.max_new_tokens``, the budget of one turn).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, WindowCheckConfig, register_check
from grpo_lightning.health.episode_cuts import is_episode_batch
from grpo_lightning.health.view import StepView


@dataclass
class TruncationCheckConfig(WindowCheckConfig):
    """Most completions cut at rollout.max_new_tokens."""

    window: int = option(20, "Steps over which the share of cut completions is averaged.")
    max_clipped_frac: float = option(
        0.8, "Alert when more than this share of the completions was cut at rollout.max_new_tokens."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(
            problems, 0 <= self.max_clipped_frac < 1, f"{p}max_clipped_frac={self.max_clipped_frac} must be in [0, 1)"
        )
        return problems


@register_check(TruncationCheckConfig)
class TruncationCheck(HealthCheck):
    name = "truncation"
    failure = "F7"
    title = "completions cut at max_new_tokens"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._window: deque[np.ndarray] = deque(
            maxlen=cfg.window
        )  # (cut, sequences, reward cut, reward finished, finished)

    def measure(self, view: StepView) -> dict[str, float]:
        r = view.rollout
        if r.finished is None:
            return {
                "cut": 0.0,
                "sequences": 0.0,
                "reward_cut": 0.0,
                "reward_finished": 0.0,
                "finished": 0.0,
                "length": 0.0,
            }
        finished = r.finished.bool().cpu()
        rewards = r.rewards.detach().cpu().double()
        return {
            "cut": float((~finished).sum()),
            "sequences": float(finished.numel()),
            "reward_cut": float(rewards[~finished].sum()),
            "reward_finished": float(rewards[finished].sum()),
            "finished": float(finished.sum()),
            "length": float(r.completion_mask.sum()),
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        if not t["sequences"]:
            return {}, None
        if is_episode_batch(view.rollout):  # an episode's length budget is not max_new_tokens: episode_limits
            return {"clipped_frac": t["cut"] / t["sequences"]}, None  # names the limit that cut (episode_cuts.py)
        self._window.append(np.array([t["cut"], t["sequences"], t["reward_cut"], t["reward_finished"], t["finished"]]))
        cut, seqs, reward_cut, reward_fin, fin = np.sum(self._window, axis=0)
        frac = cut / seqs
        metrics = {"clipped_frac": t["cut"] / t["sequences"], "clipped_frac_window": frac}
        if len(self._window) < self._window.maxlen or frac <= self.cfg.max_clipped_frac:
            return metrics, None
        mean_cut = reward_cut / max(cut, 1.0)
        mean_fin = f"{reward_fin / fin:.3f}" if fin else "n/a (none finished)"
        evidence = (
            f"{frac:.0%} of the completions of the last {len(self._window)} steps were cut at rollout.max_new_tokens="
            f"{view.rollout.max_new_tokens} tokens without finishing (threshold {self.cfg.max_clipped_frac:.0%}); "
            f"mean reward of the cut completions {mean_cut:.3f}, of the finished ones "
            f"{mean_fin}; mean completion length this step {t['length'] / t['sequences']:.1f} tokens"
        )
        return metrics, Finding(evidence + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the completion budget is shorter than the answers the policy writes (a reasoning model that thinks "
            "before answering, a chat template that adds a preamble), so the answer tag or the final number is cut "
            "off and scores 0: the most common cause of a reward stuck at zero."
        )
        fix = (
            f"raise rollout.max_new_tokens (now {view.rollout.max_new_tokens}); ask for a short answer in "
            "task.instruction / task.system_prompt; shape the length instead of cutting it (an overlong_penalty "
            "entry in task.rewards with task.overlong_buffer_tokens) and leave the cut ones out of the loss "
            "(algorithm.mask_truncated=true)."
        )
        return causes, fix
