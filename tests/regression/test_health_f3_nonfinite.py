"""F3: NaN written into the logits (hence the log-probs) of some sequences is caught at the
first step by the nonfinite check, with the dropped-sequence count; the twin is clean."""

from __future__ import annotations

import torch
from conftest import fit, make_config

POISONED_STEP = 3


def _poison_logits(run):
    """From step 3 on, the training forward of row 0 of each micro-batch returns NaN logits."""

    def hook(module, inputs, output):
        if torch.is_grad_enabled() and run.module.global_step >= POISONED_STEP:
            output = output.clone()
            output[0, 0] = float("nan")  # the logits of the first completion token
            return output
        return output

    run.module.policy.lm_head.register_forward_hook(hook)


def test_nan_log_probs_are_diagnosed_as_f3():
    # Four micro-batches of 32 (auto would take the 128 short rows in one), so that four rows are poisoned.
    run = fit(make_config(6, **{"algorithm.micro_batch_size": 32}), prepare=_poison_logits)
    alerts = run.health.alerts_for("nonfinite")
    assert alerts, f"no nonfinite alert; alerts: {[a.check for a in run.health.alerts]}"
    alert = alerts[0]
    assert alert.failure == "F3"
    assert alert.step == POISONED_STEP
    assert alert.values["seqs"] == 4  # one row in each of the 4 micro-batches of 32
    assert "4 sequences had non-finite log-probs" in alert.evidence
    assert "trainer.precision" in alert.fix and "algorithm.lr" in alert.fix
    assert run.module.counters.nonfinite_seqs >= 4  # the module's guard dropped them too


def test_healthy_twin_has_no_nonfinite_alert():
    run = fit(make_config(6))
    assert run.health.alerts_for("nonfinite") == []
    assert run.health.last_metrics["health/nonfinite/seqs"] == 0.0


def test_degenerate_output_is_diagnosed():
    """A policy that emits one token repeated (the '!!!!!!!!' aftermath) trips the degenerate check."""

    def force_repeats(run):
        tokenizer = run.tokenizer
        seven = tokenizer.convert_tokens_to_ids("7")

        def hook(module, inputs, output):
            if not torch.is_grad_enabled():  # generation only
                output = output.clone()
                output[..., :] = -30.0
                output[..., seven] = 30.0
            return output

        run.module.policy.lm_head.register_forward_hook(hook)

    run = fit(make_config(5), prepare=force_repeats)
    alerts = run.health.alerts_for("degenerate")
    assert alerts and alerts[0].failure == "F3"
    assert alerts[0].values["frac"] == 1.0
    assert "'7777'" in alerts[0].evidence
