"""Distillation's health checks (health/distillation.py) on made-up steps: the KL that does not fall, the
reward that falls while the KL falls, and the reward checks that stand down for a teacher."""

from __future__ import annotations

import torch

from grpo_lightning.callbacks.health import HealthMonitor
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.health import StepView
from grpo_lightning.health.constant_reward import ConstantRewardCheck, ConstantRewardCheckConfig
from grpo_lightning.health.distillation import (
    DistillKLCheck,
    DistillKLCheckConfig,
    DistillRewardCheck,
    DistillRewardCheckConfig,
)
from grpo_lightning.health.reward_signal import RewardSignalCheck, RewardSignalCheckConfig
from grpo_lightning.records import PassStats, RolloutBatch, StepContext, StepResult


def view(step: int, kl: float | None, reward: float, teacher: bool = True, weight: float = 1.0) -> StepView:
    """Two groups of two; ``exact`` scores ``reward`` for every sample (so every group is tied)."""
    n = 4
    rollout = RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, 3, dtype=torch.long),
        completion_mask=torch.ones(n, 3, dtype=torch.long),
        rewards=torch.full((n,), reward * weight),
        group_size=2,
        max_new_tokens=3,
        temperature=1.0,
        step=step,
        reward_components={"exact": torch.full((n,), reward)},
        completions=["1"] * n,
    )
    cfg = AlgorithmConfig()
    if teacher:
        cfg.teacher.kind = "context"
    metrics = {} if kl is None else {"distill/kl": kl}
    result = StepResult(passes=[PassStats()], rollout=rollout, metrics=metrics)
    context = StepContext(cfg, 1e-3, correctness_reward="exact", reward_weights={"exact": weight})
    return StepView(step, rollout, result, context)


def run(check, series) -> list:
    findings = []
    for step, (kl, reward) in enumerate(series):
        v = view(step, kl, reward)
        metrics, finding = check.evaluate(check.measure(v), v)
        findings.append(finding)
    return findings


def test_a_falling_kl_is_healthy_and_a_flat_one_is_named():
    check = DistillKLCheck(DistillKLCheckConfig(window=5))
    assert not any(run(check, [(1.0 / (1 + s), 0.5) for s in range(12)]))
    check = DistillKLCheck(DistillKLCheckConfig(window=5))
    findings = run(check, [(0.8 + 0.01 * (s % 2), 0.5) for s in range(12)])
    assert findings[:9] == [None] * 9 and findings[9] is not None  # once 2 x window steps ran
    assert "it fell by" in findings[9].evidence and "less than the 10%" in findings[9].evidence
    causes, fix = check.diagnosis(view(0, 0.8, 0.5))
    assert "different prompts" in causes and "the wrong teacher" in causes and "algorithm.lr" in fix


def test_a_kl_near_zero_from_the_start_says_the_teacher_is_the_student():
    findings = run(DistillKLCheck(DistillKLCheckConfig(window=3)), [(1e-5, 0.5)] * 6)
    assert "near 0 from the start" in findings[-1].evidence


def test_the_reward_falling_while_the_kl_falls_is_named():
    falling = [(1.0 / (1 + s), 0.8 - 0.05 * s) for s in range(10)]
    findings = run(DistillRewardCheck(DistillRewardCheckConfig(window=5)), falling)
    assert findings[-1] is not None and "the teacher does worse at this task" in findings[-1].evidence
    rising = [(1.0 / (1 + s), 0.2 + 0.05 * s) for s in range(10)]
    assert not any(run(DistillRewardCheck(DistillRewardCheckConfig(window=5)), rising))


def test_without_a_teacher_the_checks_say_nothing():
    for check in (
        DistillKLCheck(DistillKLCheckConfig(window=2)),
        DistillRewardCheck(DistillRewardCheckConfig(window=2)),
    ):
        for step in range(6):
            v = view(step, None, 0.5, teacher=False)
            assert check.evaluate(check.measure(v), v) == ({}, None)


def test_reward_checks_stand_down_for_a_teacher():
    """Pure distillation: every reward weight 0, every group tied, a function that never varies: no alert."""
    signal = RewardSignalCheck(RewardSignalCheckConfig(window=3))
    constant = ConstantRewardCheck(ConstantRewardCheckConfig(batches=2))
    for teacher in (True, False):
        signal, constant = (
            RewardSignalCheck(RewardSignalCheckConfig(window=3)),
            ConstantRewardCheck(ConstantRewardCheckConfig(batches=2)),
        )
        found = []
        for step in range(4):
            v = view(step, 0.5, 0.0, teacher=teacher, weight=0.0)
            found += [check.evaluate(check.measure(v), v)[1] for check in (signal, constant)]
        assert any(found) != teacher  # without a teacher both speak; with one neither does


def test_their_windows_go_into_a_checkpoint_as_plain_data():
    """A resumed run judges as the uninterrupted one: the windows survive the monitor's state_dict."""
    monitor = HealthMonitor()
    kl_check = next(c for c in monitor.checks if c.name == "distill_kl")
    series = [(0.8, 0.5)] * 45
    run(kl_check, series[:30])
    resumed = HealthMonitor()
    resumed.load_state_dict(monitor.state_dict())
    again = next(c for c in resumed.checks if c.name == "distill_kl")
    assert run(again, series[30:]) == run(kl_check, series[30:])
    assert run(again, [(0.8, 0.5)])[0] is not None
