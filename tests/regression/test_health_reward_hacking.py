"""The silent failures of a run that learns the format and not the task, reproduced on the
tiny model: a shaping reward that is easy, a correctness reward that is impossible. The
reward_hacking, truncation and (relative) entropy-collapse alerts fire with their texts;
held-out accuracy that falls below its pre-training value by two standard errors alerts."""

from __future__ import annotations

import random
import warnings

import pytest
from conftest import fit, make_config

from grpo_lightning import build
from grpo_lightning.health import RewardHackingCheck
from grpo_lightning.health.reward_hacking import RewardHackingCheckConfig
from grpo_lightning.rewards import register_reward


@register_reward("test_starts_with_seven")
def starts_with_seven(prompts, completions, **_):
    """An easy 'format' reward: the tiny model learns it within ~15 steps at lr 3e-3."""
    return [float(c.startswith("7")) for c in completions]


@register_reward("test_impossible")
def impossible(prompts, completions, answer, **_):
    """A correctness reward the tiny model cannot earn: '<' and '>' are not in its alphabet."""
    return [float(c.strip() == f"<{a}>") for c, a in zip(completions, answer, strict=True)]


def hacking_run(steps: int, **overrides):
    return fit(
        make_config(
            steps,
            **{
                "task.rewards": {"test_impossible": 1.0, "test_starts_with_seven": 0.5},
                "task.correctness_reward": "test_impossible",
                "algorithm.lr": 3e-3,
                "algorithm.beta": 0.0,  # nothing holds the policy near its start: the collapse comes fast
                "rollout.prompts_per_step": 8,
                **overrides,
            },
        )
    )


def test_shaping_learned_while_correctness_stays_zero_alerts_with_entropy_collapse():
    run = hacking_run(24)
    [alert] = run.health.alerts_for("reward_hacking")
    assert alert.step == 19  # as soon as the 20-step window is full
    assert "'test_starts_with_seven' rose" in alert.evidence
    assert "the correctness reward 'test_impossible' was 0 on every sample of the last 20 steps" in alert.evidence
    assert alert.values["correctness_late"] == 0.0
    assert "lower the shaping weight (task.rewards.test_starts_with_seven (now 0.5))" in alert.fix
    assert "raise rollout.max_new_tokens (now 4)" in alert.fix and "lower algorithm.lr (now 0.003)" in alert.fix
    assert "eval.every_n_steps" in alert.fix
    # the entropy fell from ~2.9 nats to ~0.6: far above the absolute 1e-3, caught relative to the start
    [collapse] = run.health.alerts_for("degenerate")
    assert "The entropy fell to" in collapse.evidence and "of the run's start" in collapse.evidence
    assert "while the correctness reward fell or stayed at zero" in collapse.evidence
    assert run.health.last_metrics["health/degenerate/entropy"] > 1e-3


def test_no_reward_hacking_or_entropy_alert_when_correctness_is_what_rises():
    """The same dynamics, but 'starts with 7' is the correctness reward (and the other component
    never moves): the entropy collapses just as far, yet the policy is solving its task."""
    run = hacking_run(
        24,
        **{
            "task.rewards": {"test_starts_with_seven": 1.0, "test_impossible": 0.0},
            "task.correctness_reward": "test_starts_with_seven",
        },
    )
    assert run.health.last_metrics["health/degenerate/entropy_vs_start"] < 0.25
    assert run.health.alerts_for("reward_hacking") == []
    assert all("The entropy fell to" not in a.evidence for a in run.health.alerts_for("degenerate"))


def test_truncation_alert_and_reward_signal_names_it():
    """A completion budget of 1 token: almost nothing finishes, the correctness reward is stuck at 0."""
    run = fit(
        make_config(
            22,
            **{
                "rollout.max_new_tokens": 1,
                "task.rewards": {"test_impossible": 1.0},
                "task.correctness_reward": "test_impossible",
                "rollout.prompts_per_step": 4,
            },
        )
    )
    [alert] = run.health.alerts_for("truncation")
    assert alert.text.startswith(
        "[grpo_lightning health] F7 completions cut at max_new_tokens (check 'truncation', step 19)"
    )
    assert "of the completions of the last 20 steps were cut at rollout.max_new_tokens=1 tokens" in alert.evidence
    assert alert.values["clipped_frac_window"] > 0.8
    assert "raise rollout.max_new_tokens (now 1)" in alert.fix
    [signal] = run.health.alerts_for("reward_signal")
    assert "of this step's completions were cut at rollout.max_new_tokens=1" in signal.causes
    assert signal.fix.startswith("raise rollout.max_new_tokens (now 1)")


def test_held_out_accuracy_fall_beyond_two_standard_errors():
    check = RewardHackingCheck(RewardHackingCheckConfig())
    assert check.observe_validation(0.217, 60, step=0) is None  # the baseline
    assert check.observe_validation(0.15, 60, step=10) is None  # within 2 SE (0.145)
    finding = check.observe_validation(0.0, 60, step=20)
    assert finding is not None
    assert finding.evidence.startswith(
        "held-out accuracy (val/accuracy, greedy) fell from 0.217 before training (60 prompts) to 0.000 at step 20"
    )
    assert finding.values["stderr"] == pytest.approx((0.217 * 0.783 / 60) ** 0.5)


def test_held_out_fall_alerts_through_the_monitor():
    """Validation before training and every 6 steps; the policy unlearns 'starts with 7' because the
    shaping reward pays for anything else: held-out accuracy falls and the monitor says so."""

    @register_reward("test_not_seven")
    def not_seven(prompts, completions, **_):
        return [float(not c.startswith("7")) for c in completions]

    cfg = make_config(
        18,
        **{
            "task.rewards": {"test_starts_with_seven": 0.0, "test_not_seven": 1.0},
            "task.correctness_reward": "test_starts_with_seven",
            "algorithm.lr": 3e-3,
            "rollout.prompts_per_step": 8,
            "eval.every_n_steps": 6,
            "eval.num_prompts": 32,
        },
    )
    run = build.build_run(cfg)
    # start from a policy that answers '7...' often: a few steps of the opposite reward first
    warm = make_config(
        12,
        **{
            "task.rewards": {"test_starts_with_seven": 1.0},
            "task.correctness_reward": "test_starts_with_seven",
            "algorithm.lr": 3e-3,
            "rollout.prompts_per_step": 8,
        },
    )
    primed = fit(warm)
    run.module.policy.load_state_dict(primed.module.policy.state_dict())
    trainer = run.trainer(cfg, enable_progress_bar=False)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build.fit(run, trainer, cfg)
    alerts = run.health.alerts_for("reward_hacking")
    held_out = [a for a in alerts if a.evidence.startswith("held-out accuracy (val/accuracy, greedy) fell from")]
    assert len(held_out) == 1  # once, though three validations after the baseline are all below it
    assert "before training" in held_out[0].evidence and "lower algorithm.lr" in held_out[0].fix


def test_held_out_accuracy_past_its_peak_names_the_step_to_keep():
    """SmolLM2 on reasoning-gym gcd (docs/real_tasks.md): up from 0.183 to 0.450 at step 10, down to
    0.200 at step 30 -- never below its start, but 2.9 standard errors below its best."""
    check = RewardHackingCheck(RewardHackingCheckConfig())
    assert check.observe_validation(0.183, 60, step=0) is None
    assert check.observe_validation(0.450, 60, step=10) is None
    assert check.observe_validation(0.350, 60, step=20) is None  # 1.1 SE below the best
    finding = check.observe_validation(0.200, 60, step=30)
    assert finding is not None
    assert finding.evidence.startswith(
        "held-out accuracy (val/accuracy, greedy) fell from its best, 0.450 at step 10 (60 prompts; 0.183 before "
        "training) to 0.200 at step 30 (60 prompts), a drop of 0.250"
    )
    assert "the checkpoint of step 10 is the one to keep" in finding.evidence
    assert finding.values["stderr"] == pytest.approx((0.45 * 0.55 / 60 + 0.2 * 0.8 / 60) ** 0.5)
    # with val_from_best=false only the pre-training value counts: 0.200 is above it
    baseline_only = RewardHackingCheck(RewardHackingCheckConfig(val_from_best=False))
    assert [
        baseline_only.observe_validation(a, 60, step=s) for s, a in ((0, 0.183), (10, 0.45), (20, 0.35), (30, 0.2))
    ] == [None] * 4


def test_held_out_alerts_match_the_two_standard_error_rule_on_random_curves():
    """Property test over random curves: an alert fires exactly when a validation is more than two
    standard errors below the best one before it, and not again until a validation recovers."""
    rng = random.Random(0)
    fired_total = 0
    for _ in range(300):
        n = rng.choice([20, 60, 100])
        curve = [rng.randint(0, n) / n for _ in range(rng.randint(2, 8))]
        check = RewardHackingCheck(RewardHackingCheckConfig())
        alerted = False
        for step, p in enumerate(curve):
            finding = check.observe_validation(p, n, step=step)
            best = max(curve[:step]) if step else None
            fallen = best is not None and best - p > 2 * (best * (1 - best) / n + p * (1 - p) / n) ** 0.5
            assert (finding is not None) == (fallen and not alerted), (curve, step)
            alerted = fallen
            fired_total += finding is not None
    assert fired_total > 50  # the random curves do exercise the alert


def test_the_recipe_curves_never_alert():
    """The rising held-out curves of docs/real_tasks.md (60 prompts) stay silent."""
    for curve in (
        [0.467, 0.767, 0.883, 0.933],
        [0.467, 0.783, 0.983, 0.933],
        [0.217, 0.350, 0.450, 0.483],
        [0.217, 0.483, 0.500, 0.433],
        [0.233, 0.517, 0.533, 0.550],
        [0.183, 0.433, 0.300, 0.367],
    ):
        check = RewardHackingCheck(RewardHackingCheckConfig())
        assert [check.observe_validation(a, 60, step=10 * i) for i, a in enumerate(curve)] == [None] * 4, curve
