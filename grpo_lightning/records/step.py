"""The records of one optimization step: per-pass statistics (:class:`PassStats`), the step's
outcome (:class:`StepResult`) that the health monitor reads, the settings it ran under
(:class:`StepContext`), and the weights a sync pushes (:class:`PolicyWeights`). Imports only torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from grpo_lightning.records.rollout import RolloutBatch


class TokenLogProbs(NamedTuple):
    """Per-token log-probs of the completions under one model (the policy, the reference, or the old policy)."""

    logp: torch.Tensor  # [B, T] float32, 0 where not finite
    entropy: torch.Tensor | None  # [B, T] float32 or None
    finite: torch.Tensor  # [B, T] bool: the logits row and the log-prob were finite


@dataclass(frozen=True)
class CapturedRows:
    """A pass's final hidden states at the positions that predict a completion token, in the row-major
    order of ``valid`` [b, C] (what a distillation divergence needs of each model), and its head."""

    rows: torch.Tensor  # [n, H]
    valid: torch.Tensor  # [b, C] bool: the completion layout's real tokens
    head: torch.nn.Linear


@dataclass(frozen=True)
class AggregationRecord:
    """How one loss term was reduced to a scalar: the mode and the normalizer it divided by."""

    mode: str
    normalizer: float | torch.Tensor


@dataclass(frozen=True)
class StepContext:
    """What a monitor reads besides the :class:`StepResult`: the settings the step ran under,
    given by the module (``GRPOModule.step_context``) so no check reaches into it."""

    algorithm: Any  # the AlgorithmConfig (kept untyped: this layer imports no config)
    lr: float  # the learning rate of the step
    filtered_sampling: bool = False  # top_p < 1 or top_k > 0: the engine sampled from a sharper distribution
    correctness_reward: str | None = None  # the reward function whose score 1 means correct
    reward_weights: dict[str, float] = field(default_factory=dict)  # reward function -> weight


@dataclass(frozen=True)
class PolicyWeights:
    """What a weight sync pushes into an engine: named tensors (the engine's names) and the
    version they become (the optimizer step); never the module they came from."""

    tensors: Iterable[tuple[str, torch.Tensor]]
    version: int
    seconds: float = 0.0  # spent gathering them (a LoRA policy's merge), counted in the sync's time
    adapter_config: dict | None = None  # set: ``tensors`` are a LoRA adapter's (PEFT names), not the weights


@dataclass
class PassStats:
    """What one pass over the generation batch measured (sums, turned into means on logging)."""

    loss: float = 0.0
    finite_loss: bool = True
    kept_tokens: float = 0.0
    kl_sum: float = 0.0
    entropy_sum: float = 0.0
    clip_low_sum: float = 0.0
    clip_high_sum: float = 0.0
    dropped_seqs: int = 0
    # engine vs trainer log-probs (only when the rollout carries engine log-probs)
    engine_tokens: float = 0.0
    logp_diff_sum: float = 0.0
    is_ratio_max: float = 0.0
    is_truncated: float = 0.0
    # Read by the health monitor (F1, F5): each loss term's aggregated value and the
    # aggregation it used, and each sequence's summed log-prob (NaN where dropped).
    policy_loss: float = 0.0
    kl_loss: float = 0.0
    aggregation: dict[str, AggregationRecord] = field(default_factory=dict)
    seq_logp: torch.Tensor | None = None
    old_logprobs: TokenLogProbs | None = None  # the pass's policy log-probs, when asked to record them

    def token_mean(self, name: str) -> float:
        return getattr(self, name) / max(self.kept_tokens, 1.0)


@dataclass
class StepResult:
    """The outcome of one training step, kept on the module (``last_step``) for the monitor and callbacks."""

    passes: list[PassStats] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one reason per skipped optimizer step
    advantages: torch.Tensor | None = None  # [N], as used by the loss (the F5 check reads them)
    rollout: RolloutBatch | None = None  # the generation batch this step trained on
    metrics: dict[str, float] = field(default_factory=dict)  # the step's logged metrics (train/*, reward/*, ...)
    mismatch: dict[str, float] = field(default_factory=dict)  # engine-trainer mismatch totals (algorithm/mismatch.py)

    @property
    def steps_taken(self) -> int:
        return len(self.passes) - len(self.skipped)

    @property
    def nonfinite(self) -> bool:
        """A pass had a non-finite loss or gradient norm."""
        return any(not p.finite_loss for p in self.passes) or not all(math.isfinite(g) for g in self.grad_norms)
