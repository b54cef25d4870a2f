"""F1: identical completions. Are a group's samples (and a prompt's samples across steps)
more alike than the policy's own probabilities allow?

A converged policy legitimately repeats itself, so a raw "all identical" fraction cannot
tell a broken sampler from a confident model. This check compares what it sees with what
independent sampling would give: for sample i with probability p_i under the sampling
policy, the number of other samples of its group equal to it has expectation
(G - 1) x p_i. Eight identical samples of a completion with p = 0.9 are expected; eight
identical samples of one with p = 0.01 mean the samples were not drawn independently.
Counted per sample (has it a duplicate in its group?) so that one big cluster cannot
dominate. The same test runs across steps: when a prompt comes back, its new samples should hit its
previous completions only as often as those completions are likely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_lightning.config.base import option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import ExcessCheckConfig, HealthCheck, excess, register_check
from grpo_lightning.health.counting import count_in, max_where_equal, row_keys
from grpo_lightning.health.view import StepView


@dataclass
class DiversityCheckConfig(ExcessCheckConfig):
    """F1: identical completions within a group or across steps."""

    memory_prompts: int = option(
        10000, "Prompts whose last completions are remembered to spot a repeat at a later step; 0 turns that off."
    )


@register_check(DiversityCheckConfig)
class DiversityCheck(HealthCheck):
    name = "diversity"
    failure = "F1"
    title = "identical completions: the samples of a group are not independent"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._memory: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # prompt -> (hashes, probs), oldest first

    def measure(self, view: StepView) -> dict[str, float]:
        size = view.group_size
        hashes = view.completion_hashes.reshape(-1, size)
        groups = hashes.shape[0]
        keys = row_keys(hashes)
        copies = count_in(keys, keys)  # [g, G], itself included (by sorting: memory linear in G)
        probs = view.sample_probs
        probs = np.zeros(hashes.shape) if probs is None else probs.reshape(-1, size)
        stats = {
            "groups": float(groups),
            "identical_groups": float((copies[:, 0] == size).sum()),
            "distinct": float((1.0 / copies).sum()),  # each distinct completion adds up to 1
            # Per sample: does another sample of its group equal it? Independent sampling
            # predicts it with probability 1 - (1 - p)^(G-1) <= min(1, (G-1) p).
            "dup_obs": float((copies > 1).sum()),
            "dup_exp": float(np.minimum((size - 1) * probs, 1.0).sum()),
            "dup_possible": float(hashes.size),
        }
        stats.update(self._repeats(view.group_prompt_hashes.tolist(), hashes, probs))
        return stats

    def _repeats(self, prompts: list[int], hashes: np.ndarray, probs: np.ndarray) -> dict[str, float]:
        """Completions of a returning prompt that repeat one of its previous step's, and how
        many independent sampling predicts: G x the probability mass of the previous
        completions (the larger of then and now; a completion seen k times counts k times,
        which only errs towards expecting more repeats)."""
        if self.cfg.memory_prompts <= 0:
            return {"repeat_obs": 0.0, "repeat_exp": 0.0, "repeat_possible": 0.0}
        rows, old_hashes, old_probs = [], [], []
        memory = self._memory  # a dict keeps insertion order: re-inserting makes a prompt the newest
        for row, prompt in enumerate(prompts):
            before = memory.pop(prompt, None)
            if before is not None:
                rows.append(row)
                old_hashes.append(before[0])
                old_probs.append(before[1])
            memory[prompt] = (hashes[row], probs[row])
        while len(memory) > self.cfg.memory_prompts:
            del memory[next(iter(memory))]
        if not rows:
            return {"repeat_obs": 0.0, "repeat_exp": 0.0, "repeat_possible": 0.0}
        new, new_p = hashes[rows], probs[rows]
        old, old_p = np.stack(old_hashes), np.stack(old_probs)
        keys = row_keys(np.concatenate([old, new], axis=1))  # a returning prompt's then and now
        old_keys, new_keys = keys[:, : old.shape[1]], keys[:, old.shape[1] :]
        p_now = max_where_equal(new_keys, new_p, old_keys)  # per old sample: its likeliest twin now
        likely = np.maximum(old_p, p_now).sum(axis=1)
        size = hashes.shape[1]
        return {
            "repeat_obs": float((count_in(old_keys, new_keys) > 0).sum()),
            "repeat_exp": float(size * np.minimum(likely, 1.0).sum()),
            "repeat_possible": float(len(rows) * size),
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        size, groups = view.group_size, max(t["groups"], 1.0)
        metrics = {
            "distinct_per_group": t["distinct"] / groups,
            "identical_group_frac": t["identical_groups"] / groups,
            "duplicate_frac": t["dup_obs"] / max(t["dup_possible"], 1.0),
            "duplicate_expected_frac": t["dup_exp"] / max(t["dup_possible"], 1.0),
            "repeat_frac": t["repeat_obs"] / max(t["repeat_possible"], 1.0),
        }
        ratio, margin = self.cfg.excess_ratio, self.cfg.min_excess_frac
        within = excess(t["dup_obs"], t["dup_exp"], t["dup_possible"], ratio, margin)
        across = excess(t["repeat_obs"], t["repeat_exp"], t["repeat_possible"], ratio, margin)
        if not (within or across):
            return metrics, None
        parts = [
            f"{t['identical_groups']:.0f} of {t['groups']:.0f} groups have all {size} completions identical "
            f"({t['distinct'] / groups:.2f} distinct completions per group of {size})",
            f"{metrics['duplicate_frac']:.0%} of the samples have a duplicate in their group, where the "
            f"policy's own probabilities predict at most {metrics['duplicate_expected_frac']:.2%}",
        ]
        if t["repeat_possible"]:
            parts.append(
                f"{t['repeat_obs']:.0f} of {t['repeat_possible']:.0f} completions of prompts seen at an earlier "
                f"step repeat a completion of that step (expected {t['repeat_exp']:.1f})"
            )
        return metrics, Finding("; ".join(parts) + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        r = view.rollout
        causes = (
            "the samples are not drawn from independent random streams: a rollout engine or server that "
            "ignores the per-request seed or uses one fixed seed for every request (the asynchronous-"
            "generation bug: one prompt, the same completion at every step), a sampler that is greedy "
            "whatever the temperature, or a step that does not enter the seed (repeats across steps). "
            "With identical samples the group's reward std, advantages, loss and KL are all zero: "
            "nothing is learned."
        )
        fix = (
            "make the engine draw request i from GenerationRequest.seed (grpo_lightning.rollout.seeding "
            "derives one per run seed, rank, step, prompt and sample); with vLLM pass "
            "SamplingParams(seed=request.seed) per request, never one shared seed; check that "
            f"rollout.temperature={r.temperature} actually reaches the sampler; compare with "
            "rollout.engine=hf, which samples every request from its own stream."
        )
        return causes, fix
