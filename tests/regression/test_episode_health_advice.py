"""Health advice for episodes names the limit that cut, with its value and option: it quoted the
episode horizon as rollout.max_new_tokens=128 and said "raise max_new_tokens (now 128)" when the
turn budget was 16 and the model's context was the limit; the limits alert read "episodes
episodes cut by limits"; the truncation check alerted on episodes as if they were completions."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from grpo_lightning.environments.limits import STOP_REASONS, EpisodeLimits
from grpo_lightning.environments.rollout import METRICS
from grpo_lightning.health.alerts import Alert
from grpo_lightning.health.episode_cuts import counts, worst_cut
from grpo_lightning.health.episode_limits import EpisodeLimitsCheck, EpisodeLimitsConfig
from grpo_lightning.health.reward_signal import RewardSignalCheck, RewardSignalCheckConfig
from grpo_lightning.health.truncation import TruncationCheck, TruncationCheckConfig

LIMITS = {"max_turns": 8, "max_turn_tokens": 16, "max_total_tokens": None, "context": 128}


def view(turns=4.0, cut_turns=0.5, **stops):
    n = float(sum(stops.values()))
    timing = {METRICS + "count": n, METRICS + "turns": turns, METRICS + "cut_turns": cut_turns}
    timing.update({f"{METRICS}stop/{reason}": float(stops.get(reason, 0)) for reason in STOP_REASONS})
    horizon = EpisodeLimits(**LIMITS).horizon()
    finished = torch.tensor([True] * stops.get("done", 0) + [False] * int(n - stops.get("done", 0)))
    rollout = SimpleNamespace(
        timing=timing,
        episode_limits=LIMITS,
        max_new_tokens=horizon,
        temperature=1.0,
        finished=finished,
        rewards=torch.zeros(len(finished)),
        completion_mask=torch.ones(len(finished), 4),
    )
    return SimpleNamespace(rollout=rollout, group_size=4, clipped_frac=float((~finished).float().mean()))


def test_the_reward_signal_advice_names_the_context_and_the_turn_budget_not_the_horizon():
    v = view(context=7, done=1)
    assert v.rollout.max_new_tokens == 128  # the horizon, which the advice quoted as max_new_tokens
    causes, fix = RewardSignalCheck(RewardSignalCheckConfig()).diagnosis(v)
    assert "rollout.max_new_tokens=128" not in causes + fix and "(now 128)" not in fix
    assert "88% of this step's episodes were ended by a limit: the model's context (128 tokens" in causes
    assert fix.startswith("lower rollout.max_new_tokens (now 16) or task.max_turns")


def test_turns_cut_at_their_budget_are_named_as_the_turn_budget():
    cut = worst_cut(counts(view(turns=4.0, cut_turns=3.5, done=7, max_turns=1).rollout), LIMITS)
    assert cut.limit == "turn_budget" and "rollout.max_new_tokens=16" in cut.what and "(now 16" in cut.fix
    cut = worst_cut(counts(view(turns=4.0, cut_turns=0.5, done=2, max_turns=6).rollout), LIMITS)
    assert cut.limit == "max_turns" and "raise task.max_turns (now 8)" in cut.fix
    assert worst_cut(counts(view(done=8).rollout), LIMITS) is None


def test_the_limits_alert_reads_once_and_names_the_option_with_its_value():
    check = EpisodeLimitsCheck(EpisodeLimitsConfig(window=1, max_cut_frac=0.5))
    v = view(max_turns=6, done=2)
    _, finding = check.evaluate(check.measure(v), v)
    causes, fix = check.diagnosis(v)
    alert = Alert(check.name, check.failure, check.title, 3, finding.evidence, causes, fix)
    assert "episodes episodes" not in alert.text and "episodes cut by limits" in alert.text
    assert "task.max_turns=8 ended the episodes" in causes and fix.startswith("raise task.max_turns (now 8)")


def test_the_truncation_check_leaves_episodes_to_the_limits_check():
    check = TruncationCheck(TruncationCheckConfig(window=1, max_clipped_frac=0.1))
    v = view(context=8)
    metrics, finding = check.evaluate(check.measure(v), v)
    assert finding is None and metrics == {"clipped_frac": 1.0}
