"""Policy losses, registered by name: ``algorithm.policy_loss`` picks one.

A policy loss is one function with one signature, ``fn(inputs: PolicyLossInputs, cfg) ->
PolicyLossOutput``: it returns the per-token loss [B, T]; aggregation (``algorithm.loss_agg``
with the global normalizer) is applied by the objective to every loss alike, so no variant
can normalize differently (F5). Register a variant with::

    @register_policy_loss("my_loss", ratio_one_identity=True)
    def my_loss(inputs: PolicyLossInputs, cfg) -> PolicyLossOutput: ...

``ratio_one_identity`` declares whether, when the ratio pi / pi_old is exactly 1 (the first
pass over a generation batch), the aggregated policy term equals ``aggregate(-A)``; the
health monitor's normalization check (F5) tests that identity only for losses that declare
it. The gradient-accumulation exactness test runs over every registered loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from grpo_lightning.algorithm.registry import make_registry

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyLossInputs:
    """What every policy loss sees for one micro-batch."""

    logp: torch.Tensor  # [B, T] float32 log-probs of the sampled tokens, with gradient
    old_logp: torch.Tensor  # [B, T] log-probs under the policy that sampled (detached)
    advantages: torch.Tensor  # [B], one per sequence
    token_mask: torch.Tensor  # [B, T] float, 1 on tokens that count in the loss


class PolicyLossOutput(NamedTuple):
    """Per-token loss plus the masks that say which tokens a clip acted on."""

    loss: torch.Tensor  # [B, T], to be aggregated with a mask
    ratio: torch.Tensor  # [B, T], pi / pi_old (detached)
    clipped_low: torch.Tensor  # [B, T] bool: ratio < 1 - clip_low and A < 0
    clipped_high: torch.Tensor  # [B, T] bool: ratio > 1 + clip_high and A > 0
    dual_clipped: torch.Tensor  # [B, T] bool: the dual clip bound the loss (A < 0)

    def clip_fractions(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fractions of the masked tokens clipped below and above (TRL's clip_ratio/low, /high)."""
        mask = mask.float()
        count = mask.sum().clamp(min=1.0)
        return (self.clipped_low.float() * mask).sum() / count, (self.clipped_high.float() * mask).sum() / count


PolicyLossFn = Callable[[PolicyLossInputs, Any], PolicyLossOutput]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss and what it declares about itself."""

    name: str
    fn: PolicyLossFn
    ratio_one_identity: bool  # F5: policy term == aggregate(-A) when the ratio is 1


POLICY_LOSSES = make_registry("policy loss", "algorithm.policy_loss")


def register_policy_loss(name: str, *, ratio_one_identity: bool) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register ``fn(inputs, cfg) -> PolicyLossOutput`` as ``algorithm.policy_loss=name``."""

    def decorate(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.add(name, PolicyLoss(name, fn, ratio_one_identity))
        return fn

    return decorate


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """Per-token clipped surrogate loss.

    ``r = exp(clamp(logp - old_logp, -20, 20))``, ``A`` the sequence advantage broadcast
    over its tokens, then ``loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)``.
    With ``dual_clip = c > 1`` (Ye et al. 2020, verl's ``clip_ratio_c``) tokens with
    ``A < 0`` are bounded by ``-c * A`` so a huge ratio cannot blow the loss up.

    With one optimization pass per generation batch ``old_logp = logp.detach()``, the
    ratio is exactly 1 and the gradient is ``-A * grad(logp)``.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    log_ratio = (logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    dual_clipped = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_clipped = (adv < 0) & (loss > bound)
        loss = torch.where(dual_clipped, bound.expand_as(loss), loss)
    ratio_d = ratio.detach()
    return PolicyLossOutput(
        loss=loss,
        ratio=ratio_d,
        clipped_low=(ratio_d < 1.0 - clip_low) & (adv < 0),
        clipped_high=(ratio_d > 1.0 + clip_high) & (adv > 0),
        dual_clipped=dual_clipped,
    )


@register_policy_loss("grpo", ratio_one_identity=True)
def grpo_loss(inputs: PolicyLossInputs, cfg: Any) -> PolicyLossOutput:
    """GRPO / PPO clipped surrogate (DeepSeekMath eq. 3), asymmetric clip (DAPO's clip-higher)
    and optional dual clip: :func:`clipped_surrogate` with ``algorithm.clip_low``,
    ``clip_high`` and ``dual_clip``."""
    return clipped_surrogate(
        inputs.logp, inputs.old_logp, inputs.advantages, cfg.clip_low, cfg.clip_high, cfg.dual_clip
    )
