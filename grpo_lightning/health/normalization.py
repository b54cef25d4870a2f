"""F5: loss normalization. Do the policy and KL terms use the configured aggregation mode and
the same global normalizer, and does the policy term have the value that mode implies?

Two independent tests:

1. What the module says: every loss term records the mode and normalizer it used
   (``PassStats.aggregation``); they must equal the configured mode and each other.
2. What the numbers say: on the first pass of a step the ratio is exactly 1, so for a policy
   loss that declares this identity (``register_policy_loss(..., ratio_one_identity=True)``,
   read from the registry here) the policy term must equal ``aggregate(-A)`` (advantages broadcast over each completion) with the
   configured mode and the normalizer of the whole batch over all ranks. A term divided by
   another normalizer (for instance a global token count in ``seq_mean_token_mean``) differs
   from it as soon as completion lengths differ. (With ``seq_mean_token_mean`` the value is
   0, the F5 report: "with beta = 0 the loss should be exactly zero, but it was not".)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_lightning.algorithm import POLICY_LOSSES, compute_advantages
from grpo_lightning.algorithm.distillation import teacher_in_advantages
from grpo_lightning.config.base import option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import PATIENCE_HELP, CheckConfig, HealthCheck, register_check
from grpo_lightning.health.view import StepView

NORMALIZER_MEANING = {
    "token_mean": "completion tokens in the batch",
    "seq_mean_token_mean": "sequences in the batch",
    "seq_mean_token_sum": "sequences in the batch",
    "seq_mean_token_sum_norm": "sequences in the batch x max_new_tokens",
}


@dataclass
class NormalizationCheckConfig(CheckConfig):
    """F5: one aggregation mode and normalizer for every loss term."""

    patience: int = option(1, PATIENCE_HELP)
    rtol: float = option(1e-4, "F5: relative tolerance of the ratio-1 identity policy term == aggregate(-advantages).")
    atol: float = option(1e-6, "F5: absolute tolerance of the same identity.")


@register_check(NormalizationCheckConfig)
class NormalizationCheck(HealthCheck):
    name = "normalization"
    failure = "F5"
    title = "inconsistent loss normalization"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.announced: str | None = None  # the once-per-run line naming the mode and normalizer

    def measure(self, view: StepView) -> dict[str, float]:
        mode = view.algorithm.loss_agg
        first = view.result.passes[0] if view.result.passes else None
        declared = first.aggregation if first is not None else {}
        normalizers = {rec.normalizer for rec in declared.values()}
        mismatched = sum(rec.mode != mode for rec in declared.values()) + (len(normalizers) > 1)
        r = view.rollout
        # With importance weighting the policy term is -A x w by design, and with a teacher's per-token
        # advantages -(A + weight x A_teacher): only the mode and normalizer of each term are checked then.
        checkable = (
            first is not None
            and first.finite_loss
            and first.dropped_seqs == 0
            and "policy" in declared
            and not view.algorithm.corrects()
            and not teacher_in_advantages(view.algorithm)
            and POLICY_LOSSES[view.algorithm.policy_loss].ratio_one_identity
        )
        stats = {"terms": float(len(declared)), "mismatched": float(mismatched), "checkable": float(checkable)}
        if checkable:
            # Written out here rather than calling algorithm.aggregation: an independent
            # statement of each mode, and a few numpy operations instead of a dozen torch ones.
            advantages = view.result.advantages
            if advantages is None:
                advantages = compute_advantages(r.rewards, r.group_size, view.algorithm)
            neg_adv = -advantages.detach().cpu().numpy().astype(np.float64)
            lengths = view.completion_mask.sum(axis=1)
            if view.algorithm.mask_truncated and r.finished is not None:
                lengths = lengths * r.finished.cpu().numpy()  # cut completions are out of the loss
            weight = (lengths > 0) if mode == "seq_mean_token_mean" else lengths
            stats["numerator"] = float((neg_adv * weight).sum())
            stats["magnitude"] = float((np.abs(neg_adv) * weight).sum())
            stats["normalizer"] = float(
                lengths.sum()
                if mode == "token_mean"
                else len(lengths) * (r.max_new_tokens if mode == "seq_mean_token_sum_norm" else 1)
            )
            stats["reported"] = first.policy_loss
            stats["declared_normalizer"] = declared["policy"].normalizer
        else:
            stats.update(numerator=0.0, magnitude=0.0, normalizer=0.0, reported=0.0, declared_normalizer=0.0)
        return stats

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        world, mode = view.world_size, view.algorithm.loss_agg
        if self.announced is None and t["checkable"] == world:
            self.announced = (
                f"loss aggregation: {mode} for the policy and KL terms; normalizer = "
                f"{NORMALIZER_MEANING[mode]} over {world} rank(s) = {t['normalizer']:g} at this step, computed "
                f"before the first backward"
            )
        metrics: dict[str, float] = {}
        problems = []
        if t["mismatched"]:
            first = view.result.passes[0]
            used = ", ".join(f"{term}: {rec.mode} / {rec.normalizer:g}" for term, rec in first.aggregation.items())
            problems.append(
                f"the loss terms did not all use the configured mode {mode} with one normalizer (on this rank: {used})"
            )
        if t["checkable"] == world and t["normalizer"] > 0:
            expected = t["numerator"] / t["normalizer"]
            scale = t["magnitude"] / t["normalizer"]
            error = abs(t["reported"] - expected)
            metrics["policy_term_error"] = error
            if error > self.cfg.atol + self.cfg.rtol * scale:
                problems.append(
                    f"with ratio 1 the policy term must equal {mode} of -advantages = {expected:.6f} "
                    f"(global normalizer {t['normalizer']:g} = {NORMALIZER_MEANING[mode]}), but the module's "
                    f"policy term was {t['reported']:.6f} (off by {error:.3g}, tolerance "
                    f"{self.cfg.atol + self.cfg.rtol * scale:.3g})"
                )
        if not problems:
            return metrics, None
        return metrics, Finding("; ".join(problems) + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        mode = view.algorithm.loss_agg
        causes = (
            "one loss term is aggregated with a different convention than the other (e.g. the policy term "
            "averaged over all tokens of the batch, (l*m).sum()/m.sum(), while the KL term is averaged per "
            "sequence), or a normalizer computed per micro-batch or per rank instead of over the whole "
            "generation batch; the gradient is then scaled differently per term and per batch layout."
        )
        fix = (
            f"aggregate every term through grpo_lightning.algorithm.objective.aggregate_term with algorithm.loss_agg (now {mode}) and "
            "the normalizer from GRPOModule.prepare; if you changed the loss, route the new term through it; "
            "choose the mode explicitly: token_mean (DAPO), seq_mean_token_mean (GRPO), seq_mean_token_sum_norm "
            "(Dr. GRPO)."
        )
        return causes, fix
