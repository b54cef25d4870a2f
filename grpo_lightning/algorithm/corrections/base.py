"""The correction interface: what one off-policy correction sees, returns and declares.

A correction compares the trainer's log-probs ("train") with the engine's ("eng") on the
sampled tokens, ``d_t = log pi_train(y_t) - log pi_eng(y_t)``, and returns a detached
per-token weight (multiplies the policy term), a keep mask (removes tokens from every term
and from the per-sequence means), or both. Which log-probs are "train" is the mode
(``algorithm.correction_mode``): ``decoupled``, the trainer's recompute at the rollout's
weights (pi_old); ``bypass``, pi_old := pi_eng and "train" is the current policy pi_theta.

Conventions (docs/corrections.md): ratios are train / engine (``r_t = exp(d_t)``), each token's
log-ratio is clamped to +-20 before anything is built from it (verl's SAFETY_BOUND; the sequence
weights clamp their sum instead), padding has ``d = 0``, weights are 1 and
keep is True outside the mask, and sequence statistics are over each row's masked tokens (a row
with none gets the neutral value, so padding rows stay finite).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, NamedTuple

import torch

from grpo_lightning.registry import Registry

LOG_RATIO_CLAMP = 20.0
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class CorrectionInputs:
    """One micro-batch as every correction sees it; the derived tensors are computed once and shared."""

    train_logp: torch.Tensor  # [B, T] pi_old (decoupled) or pi_theta (bypass), detached
    engine_logp: torch.Tensor  # [B, T] the engine's log-probs of the sampled tokens
    mask: torch.Tensor  # [B, T] float, 1 on tokens in the loss
    advantages: torch.Tensor  # [B]

    @cached_property
    def on(self) -> torch.Tensor:
        return self.mask > 0

    @cached_property
    def log_ratio(self) -> torch.Tensor:
        """[B, T] float32 ``d_t = log pi_train - log pi_eng``, 0 outside the mask (NaN padding included)."""
        d = self.train_logp.detach().float() - self.engine_logp.detach().float()
        return torch.where(self.on, d, 0.0)

    @cached_property
    def clamped_log_ratio(self) -> torch.Tensor:
        """[B, T] ``d_t`` clamped to +-20 token by token: what per-token statistics and the masks'
        sequence means are built from (verl's ``log_ratio_safe``)."""
        return self.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    @cached_property
    def token_ratio(self) -> torch.Tensor:
        """[B, T] ``r_t = exp(clamp(d_t, +-20))``."""
        return torch.exp(self.clamped_log_ratio)

    @cached_property
    def lengths(self) -> torch.Tensor:
        """[B] masked tokens per row, at least 1 (a row with none divides by 1)."""
        return self.mask.float().sum(dim=1).clamp(min=1.0)

    def seq_sum(self, values: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [B] sum over each row's masked tokens."""
        return torch.where(self.on, values, 0.0).sum(dim=1)

    def seq_mean(self, values: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [B] mean over each row's masked tokens (0 for a row with none)."""
        return self.seq_sum(values) / self.lengths

    def seq_max(self, values: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [B] max over each row's masked tokens (0 for a row with none, as verl)."""
        top = torch.where(self.on, values, float("-inf")).amax(dim=1)
        return torch.where(torch.isfinite(top), top, 0.0)

    def per_token(self, seq_values: torch.Tensor) -> torch.Tensor:
        """[B] -> [B, T] broadcast over each row."""
        return seq_values.unsqueeze(-1).expand_as(self.log_ratio)


class CorrectionOutput(NamedTuple):
    weight: torch.Tensor | None  # [B, T] detached, multiplies the policy term; None: 1
    keep: torch.Tensor | None  # [B, T] bool, False removes the token from the loss; None: all kept


class ImportanceWeights(NamedTuple):
    """The combined corrections of one micro-batch and the engine/trainer mismatch statistics."""

    weights: torch.Tensor  # [B, T] detached product of the weights, 1 without any
    abs_diff_sum: float  # sum over masked tokens of |log pi_train - log pi_eng|
    ratio_max: float  # the largest ratio the first weight correction truncates (token ratio without one)
    truncated: float  # masked tokens outside the band of at least one correction
    keep: torch.Tensor | None = None  # [B, T] bool, AND of the masks (None: all kept)
    masked_tokens: float = 0.0  # masked tokens a mask removed
    masked_seqs: float = 0.0  # sequences with at least one token removed


class Band(NamedTuple):
    """The interval of ``statistic`` inside which a correction leaves a token alone (the
    mismatch metrics report the fraction outside it); None is an open end."""

    statistic: str  # e.g. "token_ratio" r_t, "seq_ratio" R, "geo_mean_ratio" G, "seq_mean_k3"
    low: float | None
    high: float | None


class Correction:
    """One registered correction, built from its options. Subclasses set the class attributes
    and :meth:`compute`; :meth:`statistic` and :meth:`band` say what it thresholds."""

    name: ClassVar[str] = ""
    level: str = "token"  # the granularity of its decision: "token" or "sequence"
    changes_denominator: ClassVar[bool] = False  # True: it masks (keep), tokens leave every term
    required: ClassVar[tuple[str, ...]] = ()  # options without a default that must be set
    is_weight: ClassVar[bool] = True  # returns a weight (refused in bypass mode: the PPO ratio is one)

    def __init__(self, options: Any):
        self.options = options

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        raise NotImplementedError

    def statistic(self, x: CorrectionInputs) -> torch.Tensor:
        """[B, T] the quantity compared with :meth:`band` (a sequence statistic is broadcast)."""
        return x.token_ratio

    def band(self) -> Band | None:
        return None

    def outside(self, x: CorrectionInputs) -> torch.Tensor:
        """[B, T] bool: masked tokens whose statistic lies outside the band (False without one)."""
        band = self.band()
        if band is None:
            return torch.zeros_like(x.on)
        stat = self.statistic(x)
        out = torch.zeros_like(x.on)
        if band.low is not None:
            out = out | (stat < band.low)
        if band.high is not None:
            out = out | (stat > band.high)
        return out & x.on

    def __call__(self, x: CorrectionInputs) -> CorrectionOutput:
        with torch.no_grad():
            weight, keep = self.compute(x)
            if weight is not None:
                weight = torch.where(x.on, weight, 1.0).detach()
            if keep is not None:
                keep = keep | ~x.on
        return CorrectionOutput(weight, keep)


class SequenceMask(Correction):
    """A correction that drops whole sequences from the loss (every term and the per-sequence means)."""

    level = "sequence"
    changes_denominator = True
    is_weight = False


CORRECTIONS: Registry[type[Correction]] = Registry("off-policy correction", "algorithm.corrections")


def register_correction(name: str, *, options: type) -> Callable[[type[Correction]], type[Correction]]:
    """Register a :class:`Correction` subclass as ``algorithm.corrections=[name]``; its options
    dataclass becomes the node ``algorithm.<name>.*``."""

    def decorate(cls: type[Correction]) -> type[Correction]:
        cls.name = name
        return CORRECTIONS.add(name, cls, options=options)

    return decorate


def positive(p: str, **values: float | None) -> list[str]:
    """Messages for the options that are set and not > 0."""
    return [f"{p}{k}={v} must be > 0" for k, v in values.items() if v is not None and not v > 0]


def bounds(p: str, low: float | None, high: float | None, low_name: str = "lower", high_name: str = "upper") -> list:
    """Messages for an interval: both ends > 0 when set, and low < high."""
    problems = positive(p, **{low_name: low, high_name: high})
    if low is not None and high is not None and not low < high:
        problems.append(f"{p}{low_name}={low} must be < {p}{high_name}={high}")
    return problems


def help_field(default: Any, help: str) -> Any:
    """A dataclass field with one line of help (the schema's convention, for an options class)."""
    return field(default=default, metadata={"help": help})
