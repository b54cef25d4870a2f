"""Episodes cut by limits: most episodes end at max_turns, the token budget or the context, not
because the environment said they were done (multi-turn episodes only).

A cut episode rarely earns its reward; when most are cut, the reward carries little signal. The
check averages the share of cut episodes over a window and names the limit that cuts most.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import WindowCheckConfig, register_check
from grpo_lightning.health.episode_cuts import advice
from grpo_lightning.health.episode_failures import WindowedShareCheck
from grpo_lightning.health.view import StepView

LIMITS = ("max_turns", "max_total_tokens", "context")


@dataclass
class EpisodeLimitsConfig(WindowCheckConfig):
    """Most episodes cut by a limit rather than ended by the environment."""

    window: int = option(10, "Steps over which the share of cut episodes is averaged.")
    max_cut_frac: float = option(0.8, "Alert when more than this share of the episodes was cut by a limit.")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, 0 <= self.max_cut_frac < 1, f"{p}max_cut_frac={self.max_cut_frac} must be in [0, 1)")
        return problems


@register_check(EpisodeLimitsConfig)
class EpisodeLimitsCheck(WindowedShareCheck):
    name = "episode_limits"
    failure = "episodes"
    title = "cut by limits"  # (the alert reads "episodes cut by limits")
    parts = tuple(f"stop/{limit}" for limit in LIMITS)

    @property
    def threshold(self) -> float:
        return self.cfg.max_cut_frac

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        step, share, window = self.shares(t)
        if not step:
            return {}, None
        metrics = {**{k.removeprefix("stop/"): v for k, v in step.items()}, "cut_frac_window": share}
        if window is None:
            return metrics, None
        self.worst = max(window, key=window.get).removeprefix("stop/")
        evidence = (
            f"{share:.0%} of the episodes of the last {len(self._window)} steps were cut by a limit (threshold "
            f"{self.cfg.max_cut_frac:.0%}), most by {self.worst} ({window['stop/' + self.worst]:.0%} of all episodes)"
        )
        return metrics, Finding(evidence + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        cut = advice(getattr(self, "worst", "max_turns"), getattr(getattr(view, "rollout", None), "episode_limits", {}))
        causes = (
            f"{cut.what}: the episodes need more than the limit allows, or the policy does not yet end them (it "
            "never gives the answer that makes the environment say done)."
        )
        return causes, f"{cut.fix}; check that the environment can end an episode (Step.done)."
