"""``health.*``: the health monitor, one check per failure mode, each with an action and patience."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.config.base import Schema, check, choice, option

HEALTH_ACTIONS = ("warn", "raise", "ignore")
_ACTION_HELP = (
    "What an alert does: warn (warning + health/alert/<check> metric), raise (stop with the diagnosis), ignore."
)
_PATIENCE_HELP = "Consecutive suspicious steps before the alert fires."


@dataclass
class CheckConfig(Schema):
    """What every check has: an action and a patience."""

    action: str = option("warn", _ACTION_HELP)
    patience: int = option(2, _PATIENCE_HELP)

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}action", self.action, HEALTH_ACTIONS)
        check(problems, self.patience >= 1, f"{p}patience={self.patience} must be >= 1")
        return problems


@dataclass
class _ExcessCheckConfig(CheckConfig):
    excess_ratio: float = option(
        3.0, "Alert when the samples with a duplicate exceed this multiple of the expected ..."
    )
    min_excess_frac: float = option(0.2, "... plus this fraction of the samples (a floor against chance).")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.excess_ratio >= 1, f"{p}excess_ratio={self.excess_ratio} must be >= 1")
        check(problems, 0 <= self.min_excess_frac < 1, f"{p}min_excess_frac={self.min_excess_frac} must be in [0, 1)")
        return problems


@dataclass
class DiversityCheckConfig(_ExcessCheckConfig):
    memory_prompts: int = option(
        10000, "Prompts whose last completions are remembered to spot a repeat at a later step; 0 turns that off."
    )


@dataclass
class DuplicatesCheckConfig(_ExcessCheckConfig):
    pass


@dataclass
class NonFiniteCheckConfig(CheckConfig):
    patience: int = option(1, _PATIENCE_HELP + " 1: speak up at the first non-finite value.")


@dataclass
class DegenerateCheckConfig(CheckConfig):
    patience: int = option(3, _PATIENCE_HELP)
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


@dataclass
class _WindowCheckConfig(CheckConfig):
    patience: int = option(1, _PATIENCE_HELP)
    window: int = option(20, "Steps the check averages over.")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.window >= 2, f"{p}window={self.window} must be >= 2")
        return problems


@dataclass
class RewardHackingCheckConfig(_WindowCheckConfig):
    window: int = option(20, "Steps compared as an early and a late half (training rewards).")
    min_rise: float = option(0.1, "A shaping reward 'rises' when its mean gained more than this (and two std errors).")
    min_fall: float = option(
        0.05, "Correctness 'falls' when its mean lost more than this (and two std errors), or is 0 throughout."
    )
    val_from_best: bool = option(
        True, "Held-out accuracy alerts below the best validation so far; false: below the first one only."
    )


@dataclass
class TruncationCheckConfig(_WindowCheckConfig):
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


@dataclass
class NoUpdateCheckConfig(CheckConfig):
    min_update_norm: float = option(0.0, "F4: an update norm at or below this (after a step with a gradient) is none.")
    min_grad_norm: float = option(1e-12, "F4: a gradient norm above this counts as 'the loss had a gradient'.")
    tracked_per_tensor: int = option(
        256, "F4: weights sampled (strided) from every trainable tensor and compared before/after each step."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.tracked_per_tensor >= 1, f"{p}tracked_per_tensor={self.tracked_per_tensor} must be >= 1")
        return problems


@dataclass
class RewardSignalCheckConfig(CheckConfig):
    patience: int = option(1, _PATIENCE_HELP)
    window: int = option(20, "Steps over which the fraction of stuck (zero-std, unsolved) groups is averaged.")
    max_stuck_frac: float = option(
        0.9, "Alert when more than this fraction of the groups had zero reward std below the best reward seen."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.window >= 1, f"{p}window={self.window} must be >= 1")
        check(problems, 0 <= self.max_stuck_frac <= 1, f"{p}max_stuck_frac={self.max_stuck_frac} must be in [0, 1]")
        return problems


@dataclass
class ConstantRewardCheckConfig(CheckConfig):
    patience: int = option(1, _PATIENCE_HELP)
    batches: int = option(
        3, "Alert when a reward function has returned one value since the run's first this many batches."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.batches >= 1, f"{p}batches={self.batches} must be >= 1")
        return problems


@dataclass
class NormalizationCheckConfig(CheckConfig):
    patience: int = option(1, _PATIENCE_HELP)
    rtol: float = option(1e-4, "F5: relative tolerance of the ratio-1 identity policy term == aggregate(-advantages).")
    atol: float = option(1e-6, "F5: absolute tolerance of the same identity.")


@dataclass
class HealthConfig(Schema):
    enabled: bool = option(True, "Attach the HealthMonitor callback (grpo_lightning.callbacks.HealthMonitor).")
    log_every_n_steps: int = option(1, "Log health/* metrics every n steps (checks and alerts run every step).")
    diversity: DiversityCheckConfig = option(
        DiversityCheckConfig(), "F1: identical completions within a group or across steps."
    )
    duplicates: DuplicatesCheckConfig = option(DuplicatesCheckConfig(), "F2: the same completions on several ranks.")
    nonfinite: NonFiniteCheckConfig = option(
        NonFiniteCheckConfig(), "F3: non-finite log-probs, losses, gradients; skipped steps."
    )
    degenerate: DegenerateCheckConfig = option(
        DegenerateCheckConfig(), "F3: one-token-repeated completions, entropy collapse."
    )
    no_update: NoUpdateCheckConfig = option(
        NoUpdateCheckConfig(), "F4: zero parameter update; KL stuck at exactly zero."
    )
    reward_signal: RewardSignalCheckConfig = option(
        RewardSignalCheckConfig(), "Fraction of groups with zero reward std."
    )
    constant_reward: ConstantRewardCheckConfig = option(
        ConstantRewardCheckConfig(), "A reward function that has returned one value since the start of the run."
    )
    normalization: NormalizationCheckConfig = option(
        NormalizationCheckConfig(), "F5: one aggregation mode and normalizer for every loss term."
    )
    reward_hacking: RewardHackingCheckConfig = option(
        RewardHackingCheckConfig(),
        "Shaping rewards rising while correctness falls or stays 0; held-out accuracy falls.",
    )
    truncation: TruncationCheckConfig = option(
        TruncationCheckConfig(), "Most completions cut at rollout.max_new_tokens."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(problems, self.log_every_n_steps >= 1, f"{p}log_every_n_steps={self.log_every_n_steps} must be >= 1")
        return problems


HEALTH_CHECKS = (
    "diversity",
    "duplicates",
    "nonfinite",
    "degenerate",
    "no_update",
    "reward_signal",
    "constant_reward",
    "normalization",
    "reward_hacking",
    "truncation",
)
