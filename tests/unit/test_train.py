"""The console script's last line: the final metrics, readable at every magnitude."""

from __future__ import annotations

import ast

from grpo_lightning.train import final_metrics_line


def _shown(metrics: dict[str, float]) -> dict[str, str]:
    line = final_metrics_line(metrics)
    assert line.startswith("final metrics: {") and line.endswith("}")
    body = line[len("final metrics: ") :]
    return dict(item.split(": ") for item in body[1:-1].split(", ")) if body != "{}" else {}


def test_small_numbers_keep_significant_digits_and_integers_stay_integers():
    shown = _shown(
        {
            "train/lr": 2e-05,
            "reward/mean": 0.123456,
            "kl/mean": -3.2e-07,
            "train/grad_norm": 12.34567,
            "train/global_step": 5.0,
            "val/accuracy": 0.0,
            "train/tokens_per_s": 123456.78,
            "train/num_tokens": 123456.0,
        }
    )
    assert shown == {
        "'train/lr'": "2e-05",
        "'reward/mean'": "0.1235",
        "'kl/mean'": "-3.2e-07",
        "'train/grad_norm'": "12.35",
        "'train/global_step'": "5",
        "'val/accuracy'": "0",
        "'train/tokens_per_s'": "123456.8",
        "'train/num_tokens'": "123456",
    }
    assert ast.literal_eval(final_metrics_line({"train/lr": 2e-05})[len("final metrics: ") :]) == {"train/lr": 2e-05}


def test_only_the_run_level_namespaces_and_non_finite_values_as_they_are():
    shown = _shown({"reward/mean": float("nan"), "kl/mean": float("inf"), "health/alert/x": 1.0, "mismatch/k1": 0.5})
    assert shown == {"'reward/mean'": "nan", "'kl/mean'": "inf"}
    assert final_metrics_line({}) == "final metrics: {}"


def test_a_distillation_runs_teacher_kl_is_in_the_last_line():
    """A pure distillation run's console ended without distill/kl, the one number that says it learns."""
    shown = _shown({"distill/kl": 0.5, "distill/argmax_agreement": 0.25, "pipeline/lag_max": 2.0})
    assert shown == {"'distill/kl'": "0.5", "'distill/argmax_agreement'": "0.25"}
