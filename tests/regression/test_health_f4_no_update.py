"""F4: an optimizer whose step is a no-op (the gradients lost before the step) is caught by the
zero update norm and by the KL stuck at exactly zero; the twin with a real optimizer is clean."""

from __future__ import annotations

from conftest import fit, make_config

import grpo_lightning.tasks.arithmetic as arithmetic
from grpo_lightning.step.module import GRPOModule


def _noop_step(monkeypatch):
    original = GRPOModule.configure_optimizers

    def configure(self):
        config = original(self)
        optimizer = config["optimizer"]

        def step(closure=None):  # runs Lightning's closure (hooks) and applies nothing
            return closure() if closure is not None else None

        optimizer.step = step
        return config

    monkeypatch.setattr(GRPOModule, "configure_optimizers", configure)


def test_noop_optimizer_step_is_diagnosed_as_f4(monkeypatch):
    _noop_step(monkeypatch)
    run = fit(make_config(6))
    alerts = run.health.alerts_for("no_update")
    assert alerts, f"no no_update alert; alerts: {[a.check for a in run.health.alerts]}"
    alert = alerts[0]
    assert alert.failure == "F4"
    assert alert.step == 1  # patience 2: steps 0 and 1
    assert alert.values["update_norm"] == 0.0 and alert.values["grad_norm"] > 0
    assert "the weights did not change" in alert.evidence
    assert "the KL to the reference is exactly 0" in alert.evidence
    assert "zero_grad" in alert.fix


def test_healthy_twin_has_no_update_alert():
    run = fit(make_config(6))
    assert run.health.alerts_for("no_update") == []
    assert run.health.last_metrics["health/no_update/update_norm"] > 0


def test_zero_gradient_is_not_an_f4_alarm(monkeypatch):
    """With every reward equal there is no gradient: no update is then correct, not an alarm."""
    monkeypatch.setattr(arithmetic, "_leading_int", lambda text: None)  # arithmetic_close always 0
    run = fit(make_config(5, **{"task.rewards": {"arithmetic_close": 1.0}}))
    assert run.health.alerts_for("no_update") == []
    assert run.health.last_metrics["health/no_update/update_norm"] == 0.0
