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
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from grpo_lightning.registry import Registry

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
    correction_levels: tuple[str, ...] = ("token", "sequence")  # off-policy corrections it accepts


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "algorithm.policy_loss")


def register_policy_loss(
    name: str,
    *,
    ratio_one_identity: bool,
    options: type | None = None,
    correction_levels: tuple[str, ...] = ("token", "sequence"),
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register ``fn(inputs, cfg) -> PolicyLossOutput`` as ``algorithm.policy_loss=name``.

    ``options``: a dataclass of the loss's own settings; the config gets them as
    ``algorithm.<name>.*`` and the loss reads them as ``cfg.<name>``. ``correction_levels``: the
    levels of off-policy corrections (``algorithm.corrections``) that make sense with its ratio;
    others are refused at config time."""

    def decorate(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.add(name, PolicyLoss(name, fn, ratio_one_identity, correction_levels), options=options)
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
    adv = _per_token(advantages)
    ratio = _token_ratio(logp, old_logp)
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


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    """Sequence advantages [B] as [B, 1], to broadcast over the tokens."""
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def _token_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """pi / pi_old per token, the log-ratio clamped to +-LOG_RATIO_CLAMP before exp."""
    return torch.exp((logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B]: the mean over each sequence's tokens in ``mask`` (0 for a sequence with none)."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


@register_policy_loss("gspo", ratio_one_identity=True, correction_levels=("sequence",))
def gspo_loss(inputs: PolicyLossInputs, cfg: Any) -> PolicyLossOutput:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071), in its
    token form "GSPO-token" with one advantage per sequence (then it equals GSPO):

        s_i     = exp( (1/|y_i|) sum_t (log pi(y_t) - log pi_old(y_t)) )   (geometric mean of the token ratios)
        s_i,t   = sg[s_i] * pi(y_t) / sg[pi(y_t)]                          (value s_i, gradient s_i * grad log pi(y_t))
        loss_t  = -min(s_i,t * A_i, clip(s_i,t, 1 - clip_low, 1 + clip_high) * A_i)

    Clipping acts on the whole sequence: every token of a sequence is clipped or none is
    (verl's ``compute_policy_loss_gspo`` is the same construction). The paper clips far
    tighter than the token-level 0.2 (``clip_low=3e-4``, ``clip_high=4e-4``) and aggregates
    with ``seq_mean_token_mean``; set those in the config. The sequence log-ratio is clamped
    to +-20 like the token one. Off-policy corrections must be sequence-level too: a per-token
    weight under one sequence ratio mixes two estimators (refused at config time).

    F5 identity: holds. At ratio 1 every ``s_i,t`` is exactly 1, so ``loss_t = -A_i``.
    """
    adv = _per_token(inputs.advantages)
    mask = inputs.token_mask.to(inputs.logp.dtype)
    seq_log_ratio = _sequence_mean(inputs.logp.detach() - inputs.old_logp.detach(), mask)
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_ratio = inputs.logp - inputs.logp.detach() + seq_log_ratio.unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    loss = -torch.minimum(ratio * adv, ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv)
    seq_ratio = torch.exp(seq_log_ratio).unsqueeze(-1).expand_as(loss)
    no_dual = torch.zeros_like(loss, dtype=torch.bool)
    return PolicyLossOutput(
        loss=loss,
        ratio=seq_ratio,
        clipped_low=(seq_ratio < 1.0 - cfg.clip_low) & (adv < 0),
        clipped_high=(seq_ratio > 1.0 + cfg.clip_high) & (adv > 0),
        dual_clipped=no_dual,
    )


@register_policy_loss("cispo", ratio_one_identity=True)
def cispo_loss(inputs: PolicyLossInputs, cfg: Any) -> PolicyLossOutput:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4): clip the importance weight, not the update,
    and stop its gradient, so every token keeps a gradient (none is zeroed by a clip):

        J = sg[clip(r_t, 1 - clip_low, 1 + clip_high)] * A * log pi(y_t),   r_t = pi(y_t) / pi_old(y_t)
        grad loss_t = -clip(r_t, 1 - clip_low, 1 + clip_high) * A * grad log pi(y_t)

    Written here as ``loss_t = -A * sg[clip(r_t) / r_t] * r_t``: the gradient is exactly the
    paper's (``grad r_t = r_t grad log pi``), and the value is the clipped weight times -A
    (the paper's literal ``-sg[w] A log pi`` has the same gradient and a value that depends on
    log pi, meaningless as a logged loss). MiniMax leaves the lower bound off
    (``clip_low`` near 1) and tunes only the upper one; with the defaults (0.2 / 0.2) the
    weight is clipped to [0.8, 1.2] like the token ratio of PPO.

    F5 identity: holds. At ratio 1 the weight is 1 and ``loss_t = -A``.
    """
    adv = _per_token(inputs.advantages)
    ratio = _token_ratio(inputs.logp, inputs.old_logp)
    ratio_d = ratio.detach()
    weight = ratio_d.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = -adv * (weight / ratio_d) * ratio
    return PolicyLossOutput(
        loss=loss,
        ratio=ratio_d,
        # The weight was clipped (the gradient is scaled down / up, never zeroed).
        clipped_low=ratio_d < 1.0 - cfg.clip_low,
        clipped_high=ratio_d > 1.0 + cfg.clip_high,
        dual_clipped=torch.zeros_like(loss, dtype=torch.bool),
    )


@dataclass
class SapoOptions:
    """Temperatures of SAPO's soft gate (``algorithm.sapo.*``)."""

    tau_pos: float = field(
        default=1.0, metadata={"help": "Temperature of the soft gate for positive advantages (> 0)."}
    )
    tau_neg: float = field(
        default=1.05, metadata={"help": "Temperature of the soft gate for negative advantages (> 0)."}
    )

    def check_fields(self, p: str) -> list[str]:
        return [f"{p}{name}={value} must be > 0" for name, value in vars(self).items() if not value > 0]


@register_policy_loss("sapo", ratio_one_identity=False, options=SapoOptions)
def sapo_loss(inputs: PolicyLossInputs, cfg: Any) -> PolicyLossOutput:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv 2511.20347): a
    smooth, temperature-controlled gate replaces the hard clip:

        f(r) = (4 / tau) * sigmoid(tau * (r - 1)),   loss_t = -f(r_t) * A,
        tau = algorithm.sapo.tau_pos where A > 0, algorithm.sapo.tau_neg where A <= 0

    so ``grad loss_t = -4 sigmoid(x)(1 - sigmoid(x)) * r_t * A * grad log pi(y_t)`` with
    ``x = tau (r_t - 1)``: weight 1 at ratio 1, decaying smoothly as the ratio drifts (faster
    for negative advantages, ``tau_neg > tau_pos``, which the paper finds more stable). No
    token is clipped, so the clip fractions are 0. Defaults as in the paper and in verl's
    and ms-swift's ``sapo`` loss (tau_pos 1.0, tau_neg 1.05).

    F5 identity: does not hold. At ratio 1 the value is ``-(2 / tau) * A``, not ``-A``
    (the gradient still equals GRPO's there).
    """
    adv = _per_token(inputs.advantages)
    ratio = _token_ratio(inputs.logp, inputs.old_logp)
    tau = torch.where(adv > 0, cfg.sapo.tau_pos, cfg.sapo.tau_neg).to(ratio.dtype)
    gate = (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0))
    loss = -gate * adv
    never = torch.zeros_like(loss, dtype=torch.bool)
    return PolicyLossOutput(loss=loss, ratio=ratio.detach(), clipped_low=never, clipped_high=never, dual_clipped=never)
