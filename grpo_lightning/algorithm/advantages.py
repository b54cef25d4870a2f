"""Group-relative advantages (GRPO, DeepSeekMath section 4.1.2; Dr. GRPO for ``scale="none"``).

**Tied groups.** A group whose rewards are all equal carries no signal and must get
advantage exactly 0. "Equal" is defined once, here (:func:`tied_groups`), and every place
that asks "zero reward std?" (the advantages, ``reward/frac_zero_std``, the health checks)
calls it: rewards ``r`` of a group are tied when

    max(r) - min(r) <= TIE_ATOL + TIE_RTOL * max(|r|)

so rewards that differ only by float32 rounding (a weighted sum of reward functions
added in another order, 0.7 stored as 0.69999999) count as tied. The tolerance is relative
to the totals, so a total that cancels terms far larger than itself may keep their rounding;
``RewardScorer`` adds every sample's terms in one order, so samples that every reward
function scores alike get bit-equal totals and are tied exactly. Statistics are computed in
float64, so rounding cannot create signal: in float32 the mean of eight 0.7s is one ulp off,
and dividing those ulps by ``std + eps`` gave every sample |A| up to 61.

An advantage estimator is registered by name (:func:`register_advantage_estimator`) and
selected with ``algorithm.advantage_estimator``; each takes ``(rewards [N], group_size,
config)`` and returns float32 advantages [N] laid out like the rewards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_lightning.registry import Registry

ADVANTAGE_SCALES = ("group", "batch", "none")

TIE_RTOL = 1e-6  # about 8 float32 ulps of the rewards' magnitude
TIE_ATOL = 1e-6  # rewards nearer to each other than this are one reward (the old zero-std threshold)


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Rewards [N] as float64 [N / G, G]; rejects shapes that do not split into groups."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape [N], got {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of {group_size}")
    return rewards.detach().to(torch.float64).view(-1, group_size)


def rewards_equal(a, b) -> torch.Tensor:
    """Elementwise: are rewards ``a`` and ``b`` the same reward? The one definition of a tie:
    ``|a - b| <= TIE_ATOL + TIE_RTOL * max(|a|, |b|)``, in float64."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return (a - b).abs() <= TIE_ATOL + TIE_RTOL * torch.maximum(a.abs(), b.abs())


def tied_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Bool [N / G]: True where every reward of the group is the same (its max equals its min
    by :func:`rewards_equal`). A group of one sample is tied with itself."""
    grouped = _grouped(rewards, group_size)
    return rewards_equal(grouped.max(dim=1).values, grouped.min(dim=1).values)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """Advantage of each completion relative to the other completions of its prompt.

    ``rewards`` has shape [N], laid out group after group (the G completions of prompt 0,
    then those of prompt 1, ...). With ``mu_g`` the mean reward of group g:

    - ``scale="group"``: ``A_i = (r_i - mu_g) / (std_g + eps)`` (GRPO paper),
    - ``scale="batch"``: ``A_i = (r_i - mu_g) / (std_batch + eps)`` (std over all N rewards),
    - ``scale="none"``:  ``A_i = r_i - mu_g`` (Dr. GRPO: no std scaling).

    Standard deviations are unbiased (as TRL and verl compute them) and everything is
    computed in float64. A tied group (:func:`tied_groups`, which includes a group of one)
    has advantage exactly 0 in every scale, never NaN. Advantages sum to zero within every
    group (to float32 rounding). Returns float32.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    grouped = _grouped(rewards, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group" and group_size > 1:
        centered = centered / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch" and rewards.numel() > 1:
        centered = centered / (grouped.std() + eps)
    tied = tied_groups(rewards, group_size)
    return torch.where(tied[:, None], 0.0, centered).to(torch.float32).view(-1)


# ----------------------------------------------------------------------------- the registry
AdvantageEstimatorFn = Callable[[torch.Tensor, int, Any], torch.Tensor]


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: ``fn(rewards [N], group_size, algorithm_config) -> advantages [N]``."""

    name: str
    fn: AdvantageEstimatorFn


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", "algorithm.advantage_estimator")


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Register ``fn(rewards, group_size, cfg) -> advantages`` as ``algorithm.advantage_estimator=name``."""

    def decorate(fn: AdvantageEstimatorFn) -> AdvantageEstimatorFn:
        ADVANTAGE_ESTIMATORS.add(name, AdvantageEstimator(name, fn))
        return fn

    return decorate


def compute_advantages(rewards: torch.Tensor, group_size: int, cfg: Any) -> torch.Tensor:
    """The advantages of ``cfg.advantage_estimator`` (float32 [N], on the rewards' device)."""
    estimator = ADVANTAGE_ESTIMATORS[cfg.advantage_estimator]
    return estimator.fn(rewards, group_size, cfg).to(rewards.device)


@register_advantage_estimator("grpo")
def grpo_advantages(rewards: torch.Tensor, group_size: int, cfg: Any) -> torch.Tensor:
    """GRPO's group-relative advantage, scaled by ``cfg.advantage_scale`` (group / batch / none)."""
    return group_advantages(rewards, group_size, cfg.advantage_scale, cfg.advantage_eps)


@register_advantage_estimator("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, group_size: int, cfg: Any) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783):
    ``A_i = r_i - mean_g`` with no division by the group's std (which up-weights prompts that
    are nearly solved or nearly failed). The same as ``grpo`` with ``advantage_scale=none``;
    selectable by name. A tied group gets exactly 0."""
    return group_advantages(rewards, group_size, "none")


@register_advantage_estimator("rloo")
def rloo_advantages(rewards: torch.Tensor, group_size: int, cfg: Any) -> torch.Tensor:
    """RLOO, REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740):
    each sample's baseline is the mean of the OTHER G - 1 samples of its group,

        A_i = r_i - (1 / (G - 1)) sum_{j != i} r_j  =  G / (G - 1) * (r_i - mean_g),

    an unbiased baseline (it does not depend on the sample it scores). No std scaling.
    Computed in float64; a tied group (which includes a group of one) gets exactly 0."""
    centered = group_advantages(rewards, group_size, "none").to(torch.float64)
    if group_size > 1:
        centered = centered * (group_size / (group_size - 1))
    return centered.to(torch.float32)


@register_advantage_estimator("reinforce_pp")
def reinforce_pp_advantages(rewards: torch.Tensor, group_size: int, cfg: Any) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262) for outcome rewards: no group baseline; the
    returns are whitened over the whole generation batch,

        A_i = (r_i - mean_batch) / (std_batch + advantage_eps),

    (one value per sequence; verl's ``reinforce_plus_plus`` whitens the token-level returns,
    which with a single outcome reward differs only in weighting each sequence by its length).
    The KL penalty stays in the loss (``algorithm.beta``), not in the reward.

    **Tied groups** carry signal here: a group that all solved its prompt is better than the
    batch mean, and REINFORCE++ means to reinforce it. What must not carry signal is rounding,
    so every sample of a tied group (:func:`tied_groups`) is given its group's mean reward
    before whitening: all its samples get the *same* advantage, bit for bit. When the whole
    batch is one tie (every reward the same by :func:`rewards_equal`), every advantage is
    exactly 0 (never ``0 / eps``). Statistics in float64. Note: the batch is this rank's
    generation batch (under DDP each rank whitens its own).
    """
    grouped = _grouped(rewards, group_size)
    tied = tied_groups(rewards, group_size)
    grouped = torch.where(tied[:, None], grouped.mean(dim=1, keepdim=True), grouped)
    flat = grouped.reshape(-1)
    if flat.numel() < 2 or bool(rewards_equal(flat.max(), flat.min())):
        return torch.zeros(flat.numel(), dtype=torch.float32)
    return ((flat - flat.mean()) / (flat.std() + cfg.advantage_eps)).to(torch.float32)
