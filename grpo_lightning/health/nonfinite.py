"""F3: non-finite values. Counts what the module's guards caught this step: sequences dropped
for non-finite log-probs, non-finite losses and gradients, skipped optimizer steps, and
non-finite log-probs reported by the engine.

The guards keep NaN out of the weights and stop after ``max_consecutive_skips``; this check
speaks up at the first event, while the run can still be saved by a config change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lightning.config.base import option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import PATIENCE_HELP, CheckConfig, HealthCheck, register_check
from grpo_lightning.health.view import StepView


@dataclass
class NonFiniteCheckConfig(CheckConfig):
    """F3: non-finite log-probs, losses, gradients; skipped steps."""

    patience: int = option(1, PATIENCE_HELP + " 1: speak up at the first non-finite value.")


@register_check(NonFiniteCheckConfig)
class NonFiniteCheck(HealthCheck):
    name = "nonfinite"
    failure = "F3"
    title = "non-finite log-probabilities, losses or gradients"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._run_skipped = 0.0

    def measure(self, view: StepView) -> dict[str, float]:
        result = view.result
        engine = 0.0
        lp = view.rollout.engine_logprobs
        if lp is not None and not bool(torch.isfinite(lp).all()):  # the common case costs one op
            engine = float((~torch.isfinite(lp) & view.rollout.completion_mask.bool()).any(dim=1).sum())
        return {
            "seqs": float(sum(p.dropped_seqs for p in result.passes)),
            "losses": float(sum(not p.finite_loss for p in result.passes)),
            "grads": float(sum(reason == "grad" for reason in result.skipped)),
            # A step with no token in the loss (mask_truncated, all cut) is skipped, but not non-finite.
            "skipped": float(sum(reason != "nothing_in_loss" for reason in result.skipped)),
            "passes": float(len(result.passes)),
            "engine_seqs": engine,
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        world = view.world_size
        skipped, passes = t["skipped"] / world, t["passes"] / world  # the same on every rank
        self._run_skipped += skipped
        metrics = {"seqs": t["seqs"], "losses": t["losses"], "grads": t["grads"] / world, "skipped_steps": skipped}
        if not (t["seqs"] or t["losses"] or t["grads"] or t["skipped"] or t["engine_seqs"]):
            return metrics, None
        grad = view.result.grad_norms[-1] if view.result.grad_norms else float("nan")
        parts = [
            f"{t['seqs']:.0f} sequences had non-finite log-probs (dropped from the loss)" if t["seqs"] else "",
            f"{t['losses']:.0f} passes had a non-finite loss" if t["losses"] else "",
            f"{t['grads'] / world:.0f} passes had a non-finite gradient" if t["grads"] else "",
            f"the engine reported non-finite log-probs for {t['engine_seqs']:.0f} sequences"
            if t["engine_seqs"]
            else "",
        ]
        evidence = (
            "; ".join(p for p in parts if p) + f"; {skipped:.0f} of {passes:.0f} optimizer steps of this batch "
            f"were skipped ({self._run_skipped:.0f} in the run so far); last gradient norm {grad:.3g}."
        )
        return metrics, Finding(evidence, {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        a = view.algorithm
        causes = (
            "numerical overflow in the logits or in exp() of a log-ratio (fp16, a learning rate too high, "
            "a policy that drifted far from its reference), or NaN already in the inputs or the weights. "
            "This is how 'a NaN log-prob, then only !!!!!!!!' starts; the guards kept the NaN out of the "
            f"weights and will stop training after algorithm.max_consecutive_skips={a.max_consecutive_skips} "
            "skipped steps in a row."
        )
        fix = (
            "use trainer.precision=32-true or bf16-mixed (not fp16); lower algorithm.lr (now "
            f"{a.lr:g}) or algorithm.max_grad_norm (now {a.max_grad_norm:g}); keep algorithm.kl_estimator=k3 "
            f"(clamped; now {a.kl_estimator}) or lower algorithm.beta (now {a.beta:g})."
        )
        return causes, fix
