"""``StepView``: what one training step offers the checks, computed once and shared.

The fingerprints and sample probabilities are derived lazily, so a step pays only for what
the enabled checks read.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

from grpo_lightning.health.fingerprints import TextHashes, completion_hashes, token_hashes
from grpo_lightning.records import RolloutBatch, StepContext, StepResult


class StepView:
    """The step's records (:class:`StepResult`, its :class:`RolloutBatch`, the :class:`StepContext`)
    and the ranks, as the checks read them."""

    def __init__(
        self,
        step: int,
        rollout: RolloutBatch,
        result: StepResult,
        context: StepContext,
        rank: int = 0,
        world_size: int = 1,
        all_gather: Callable[[np.ndarray], np.ndarray] | None = None,
        text_hashes: TextHashes | None = None,
    ):
        self.step = step
        self.rollout = rollout
        self.result = result
        self.context = context
        self.algorithm = context.algorithm
        self.lr = context.lr
        self.rank = rank
        self.world_size = world_size
        self.all_gather = all_gather  # [N, ...] local -> [world, N, ...]; None on one rank
        self.filtered_sampling = context.filtered_sampling  # top_p < 1 or top_k > 0
        self.text_hashes = text_hashes or TextHashes()
        self.correctness_reward = context.correctness_reward  # task.correctness_reward: its score 1 means correct
        self.reward_weights = context.reward_weights  # task.rewards: reward function -> weight

    @cached_property
    def clipped_frac(self) -> float | None:
        """Share of the completions cut at max_new_tokens (no EOS); None if the engine did not say."""
        finished = self.rollout.finished
        return None if finished is None else float((~finished.bool()).float().mean())

    @property
    def group_size(self) -> int:
        return self.rollout.group_size

    @cached_property
    def completion_mask(self) -> np.ndarray:
        return self.rollout.completion_mask.cpu().numpy().astype(bool)

    @cached_property
    def completion_ids(self) -> np.ndarray:
        return self.rollout.completion_ids.cpu().numpy()

    @cached_property
    def completion_hashes(self) -> np.ndarray:
        """[N] int64, equal for equal completions (on any rank)."""
        return completion_hashes(self.rollout.completion_ids, self.rollout.completion_mask)

    @cached_property
    def group_prompt_hashes(self) -> np.ndarray:
        """[N / G] int64, one per group, equal for equal prompts (on any rank, whatever the padding)."""
        r, size = self.rollout, self.group_size
        if r.prompts:
            return self.text_hashes(r.prompts[::size])
        return token_hashes(r.prompt_ids[::size], r.prompt_mask[::size])

    @cached_property
    def prompt_hashes(self) -> np.ndarray:
        """[N] int64: the group's prompt hash for every sample."""
        return np.repeat(self.group_prompt_hashes, self.group_size)

    @cached_property
    def sample_probs(self) -> np.ndarray | None:
        """[N] probability of each completion under the sampling policy, or None if unknown.

        From the trainer's own float32 log-probs at the sampling temperature (first pass,
        before any update of this step), so a faulty engine cannot vouch for itself. With
        top-p / top-k filtering the sampling distribution is sharper than the policy's, so the
        larger of the two probabilities is used (the engine reports the filtered one). The
        engine's log-probs are also the fallback. A dropped (non-finite) sequence gets
        probability 1: it is then never evidence of a duplicate excess.
        """
        passes = self.result.passes
        trainer_side = passes[0].seq_logp if passes else None
        engine = None
        if self.rollout.engine_logprobs is not None and (trainer_side is None or self.filtered_sampling):
            lp = self.rollout.engine_logprobs.cpu().numpy().astype(np.float64)
            engine = np.where(self.completion_mask, lp, 0.0).sum(axis=1)
        if trainer_side is not None:
            logp = trainer_side.detach().cpu().numpy().astype(np.float64)
            if engine is not None:
                logp = np.fmax(logp, engine)
        elif engine is not None:
            logp = engine
        else:
            return None
        return np.where(np.isfinite(logp), np.exp(np.minimum(logp, 0.0)), 1.0)
