"""F2: duplicate samples across ranks. When a prompt's samples come from several ranks, are
the ranks' shares the same sequences?

Every rank all-gathers (prompt hash, completion hash, probability) of its samples, then
counts its own samples that have an identical twin among the samples of the same prompt on
*other* ranks, against the min(1, others x p) that independent sampling allows.
Duplicates within one rank's group are the diversity check's business (F1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import ExcessCheckConfig, HealthCheck, excess, register_check
from grpo_lightning.health.counting import count_in, pair_keys
from grpo_lightning.health.view import StepView

_ZEROS = {"samples": 0.0, "shared": 0.0, "dup_obs": 0.0, "dup_exp": 0.0, "dup_possible": 0.0}


@dataclass
class DuplicatesCheckConfig(ExcessCheckConfig):
    """F2: the same completions on several ranks."""


@register_check(DuplicatesCheckConfig)
class CrossRankDuplicatesCheck(HealthCheck):
    name = "duplicates"
    failure = "F2"
    title = "duplicate samples across ranks"

    def measure(self, view: StepView) -> dict[str, float]:
        if view.world_size == 1 or view.all_gather is None:
            return dict(_ZEROS, samples=float(len(view.completion_hashes)))
        probs = view.sample_probs
        probs = np.zeros(len(view.completion_hashes)) if probs is None else probs
        local = np.stack([view.prompt_hashes, view.completion_hashes, probs.astype(np.float64).view(np.int64)], axis=1)
        gathered = view.all_gather(local)  # [world, N, 3]
        others = np.concatenate([gathered[r] for r in range(gathered.shape[0]) if r != view.rank])
        # Counted by sorting, not by comparing every local sample with every other (memory quadratic).
        pairs = pair_keys(np.concatenate([local[:, 0], others[:, 0]]), np.concatenate([local[:, 1], others[:, 1]]))
        twins = count_in(pairs[len(local) :], pairs[: len(local)]) > 0  # same prompt and completion elsewhere
        num_others = count_in(others[:, 0], local[:, 0])
        shared = num_others > 0
        # Per sample: has it a twin on another rank? Independent sampling predicts it with
        # probability 1 - (1 - p)^n <= min(1, n p), n = samples of its prompt elsewhere.
        return {
            "samples": float(len(local)),
            "shared": float(shared.sum()),
            "dup_obs": float(twins.sum()),
            "dup_exp": float(np.minimum(num_others * probs, 1.0).sum()),
            "dup_possible": float(shared.sum()),
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        possible = max(t["dup_possible"], 1.0)  # samples whose prompt is on another rank too
        metrics = {
            "cross_rank_frac": t["dup_obs"] / possible,
            "cross_rank_expected_frac": t["dup_exp"] / possible,
            "shared_prompt_frac": t["shared"] / max(t["samples"], 1.0),
        }
        if not excess(t["dup_obs"], t["dup_exp"], t["dup_possible"], self.cfg.excess_ratio, self.cfg.min_excess_frac):
            return metrics, None
        evidence = (
            f"{metrics['cross_rank_frac']:.0%} of the samples whose prompt was also sampled on another rank have "
            f"an identical twin there ({t['dup_obs']:.0f} of {t['dup_possible']:.0f}), where the policy's own "
            f"probabilities predict at most {metrics['cross_rank_expected_frac']:.2%}; {t['shared']:.0f} of "
            f"{t['samples']:.0f} samples over {view.world_size} ranks have their prompt on another rank too."
        )
        return metrics, Finding(evidence, {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the ranks sample with the same seeds, so each rank's share of a prompt's group is the same "
            "sequences as the others' (the multi-GPU duplicate bug): a seed that does not include the rank "
            "or the engine's data-parallel index, a generation server seeded once for all workers, or every "
            "rank given the same prompts with the same seed."
        )
        fix = (
            "derive every sampling seed from the rank (grpo_lightning.rollout.seeding.sample_seed takes it; "
            "the module passes its global rank to the RolloutGenerator), give every vLLM engine its own seed, and keep "
            "PromptDataModule's PromptSampler so that the ranks get different prompts (do not replace it "
            "with a sampler that every rank iterates identically)."
        )
        return causes, fix
