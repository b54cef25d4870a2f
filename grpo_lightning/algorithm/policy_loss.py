"""The clipped surrogate objective of PPO/GRPO, per token, with DAPO's asymmetric clip."""

from __future__ import annotations

from typing import NamedTuple

import torch

LOG_RATIO_CLAMP = 20.0


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


def policy_loss(
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
