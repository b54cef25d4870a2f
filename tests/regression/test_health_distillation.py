"""Pure distillation trips none of the checks built for rewards (every reward weight 0: every group tied,
the reward functions constant at first, the policy term no longer aggregate(-A_reward)), and a student that
cannot move towards its teacher is named (distill_kl). Before the checks knew of the teacher, this run
raised reward_signal and normalization (F5) alerts (constant_reward: tests/unit/health)."""

from __future__ import annotations

from conftest import fit, make_config

from grpo_lightning.models import build_char_tokenizer, build_tiny_policy


def teacher_folder(tmp_path) -> str:
    tokenizer = build_char_tokenizer()
    build_tiny_policy(tokenizer, seed=5).save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    return str(tmp_path / "teacher")


def test_pure_distillation_trips_no_reward_check_and_a_stuck_student_is_named(tmp_path):
    overrides = {
        "algorithm.teacher.path": teacher_folder(tmp_path),
        "algorithm.beta": 0.0,
        "algorithm.lr": 1e-9,  # the student cannot move: the KL stays where it started
        "task.rewards": {"arithmetic_exact": 0.0, "arithmetic_close": 0.0},
        "health.distill_kl.window": 10,
    }
    run = fit(make_config(22, **overrides))
    checks = {a.check for a in run.health.alerts}
    assert not checks & {"reward_signal", "constant_reward", "normalization"}, checks
    (alert,) = run.health.alerts_for("distill_kl")
    assert alert.step == 19 and "distill/kl" in alert.evidence and "algorithm.lr (now 1e-09)" in alert.fix
