"""The GRPO objective of one micro-batch, from the policy's log-probs to the loss terms.

``loss = aggregate(policy_loss x w) + beta x aggregate(KL) - entropy_coef x aggregate(entropy)`` where ``policy_loss`` is the
registered loss named by ``algorithm.policy_loss``, ``w`` the product of the off-policy
corrections' weights (``algorithm.corrections``; their masks leave every term), and both terms are aggregated
with the same mode (``algorithm.loss_agg``) and the same normalizer of the whole
generation batch (F5); so is the entropy bonus, a separate term (the F5 identity check
reads the policy term alone). With ``algorithm.mask_truncated`` a completion cut at
``max_new_tokens`` is out of every term (and of the normalizer). A sequence with a non-finite log-prob (policy, reference or old) is
dropped from both terms; its rows never produce a gradient (F3).

Pure tensor math: no Lightning, no I/O. The module feeds it micro-batches and back-propagates
``LossTerms.loss``; the health monitor reads the other fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from grpo_lightning.algorithm.aggregation import aggregate
from grpo_lightning.algorithm.corrections import CorrectionInputs, apply_corrections, selected_corrections
from grpo_lightning.algorithm.corrections.base import ImportanceWeights
from grpo_lightning.algorithm.kl import kl_estimate, ratio_weighted
from grpo_lightning.algorithm.packing import PackedMicroBatch, pack_micro_batch
from grpo_lightning.algorithm.policy_loss import POLICY_LOSSES, PolicyLossInputs
from grpo_lightning.records import AggregationRecord, TokenLogProbs


@dataclass(frozen=True)
class MicroBatch:
    """Rows of the generation batch that go through one forward/backward.

    Columns that are padding in every row are trimmed: the prompt's leading ones and the
    completion's trailing ones.
    """

    rows: slice  # into the generation batch
    input_ids: torch.Tensor  # [b, prompt_width + num_cols]
    attention_mask: torch.Tensor  # [b, prompt_width + num_cols]
    prompt_width: int  # prompt columns kept; completions start here
    completion_mask: torch.Tensor  # [b, num_cols] bool, sampled tokens (EOS included)
    engine_logprobs: torch.Tensor | None  # [b, num_cols], the sampler's log-probs (vLLM)
    vision: list | None = None  # [b] each row's VisionInputs (records/vision.py) or None; None: a text policy

    @property
    def num_cols(self) -> int:
        return self.completion_mask.shape[1]

    @cached_property
    def packed(self) -> PackedMicroBatch:
        """The rows packed without padding: computed once, shared by every pass over them
        (the checkpointing choice, the reference, each optimization pass)."""
        return pack_micro_batch(self.input_ids, self.attention_mask, self.prompt_width)


@dataclass(frozen=True)
class PreparedBatch:
    """Everything computed once per generation batch, before the first backward."""

    micro_batches: list[MicroBatch]
    advantages: torch.Tensor  # [N] float32, from the registered advantage estimator
    normalizer: torch.Tensor  # scalar: the loss_agg denominator of the whole batch, all ranks
    max_new_tokens: int  # the horizon of seq_mean_token_sum_norm
    reference: TokenLogProbs | None  # [N, C] without gradient, when beta > 0
    old: TokenLogProbs | None  # [N, C] without gradient, when num_iterations > 1
    in_loss: torch.Tensor | None = None  # [N] bool: sequences in the loss (mask_truncated); None: all


def sequences_in_loss(rollout: Any, cfg: Any) -> torch.Tensor | None:
    """[N] bool, the sequences the loss sees: with ``cfg.mask_truncated`` those that ended
    (EOS) before ``max_new_tokens`` (DAPO's overlong filtering); None (all) otherwise or
    when the engine did not say which ended."""
    if not getattr(cfg, "mask_truncated", False) or rollout.finished is None:
        return None
    return rollout.finished.to(rollout.completion_mask.device).bool()


@dataclass(frozen=True)
class LossTerms:
    """One micro-batch's loss and the per-term values the health monitor reads."""

    loss: torch.Tensor  # scalar with gradient: policy + beta x kl
    policy: torch.Tensor  # scalar, the aggregated policy term
    kl: torch.Tensor  # scalar, the aggregated KL term (0 without a reference)
    aggregation: dict[str, AggregationRecord]  # per term, as aggregated (the F5 check reads it)
    kept: torch.Tensor  # [b] bool: sequences in the loss (all their log-probs finite)
    token_mask: torch.Tensor  # [b, num_cols] float: tokens in the loss
    seq_logp: torch.Tensor  # [b] summed policy log-prob per sequence, NaN where dropped (F1)
    kl_sum: torch.Tensor  # sum of the per-token KL over kept tokens (detached)
    entropy_sum: torch.Tensor  # sum of the per-token entropy over kept tokens (detached)
    clip_low_sum: torch.Tensor  # tokens whose ratio the lower clip bounded
    clip_high_sum: torch.Tensor  # tokens whose ratio the upper clip bounded
    importance: ImportanceWeights | None  # engine/trainer mismatch, when the rollout has engine log-probs
    entropy: torch.Tensor | None = None  # scalar, the aggregated entropy term (entropy_coef > 0)


def _frozen_slice(frozen: TokenLogProbs | None, mb: MicroBatch) -> TokenLogProbs | None:
    if frozen is None:
        return None
    return TokenLogProbs(frozen.logp[mb.rows, : mb.num_cols], None, frozen.finite[mb.rows, : mb.num_cols])


def aggregate_term(
    name: str, per_token: torch.Tensor, token_mask: torch.Tensor, prepared: PreparedBatch, cfg: Any
) -> tuple[torch.Tensor, AggregationRecord]:
    """Aggregate the loss term ``name`` with ``cfg.loss_agg`` and the batch's global normalizer,
    and say so: every term goes through here, so every term is reduced alike (F5)."""
    value = aggregate(per_token, token_mask, cfg.loss_agg, prepared.normalizer, prepared.max_new_tokens)
    return value, AggregationRecord(cfg.loss_agg, prepared.normalizer)


def correct(
    policy: TokenLogProbs,
    old_logp: torch.Tensor,
    mb: MicroBatch,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: Any,
) -> tuple[torch.Tensor, torch.Tensor, ImportanceWeights]:
    """The off-policy corrections (``algorithm.corrections``, docs/corrections.md) on this
    micro-batch: (the log-probs the loss takes as old, the token mask after the masks, the
    weights and statistics). ``bypass`` mode: pi_old := pi_eng, and "train" is pi_theta."""
    engine = torch.where(mask > 0, mb.engine_logprobs, old_logp)  # padding: never a NaN in the ratio
    bypass = getattr(cfg, "correction_mode", "decoupled") == "bypass"
    train = policy.logp.detach() if bypass else old_logp
    x = CorrectionInputs(train, engine, mask, advantages)
    importance = apply_corrections(selected_corrections(cfg), x)
    if importance.keep is not None:
        mask = mask * importance.keep
    return (engine if bypass else old_logp), mask, importance


def micro_batch_loss(policy: TokenLogProbs, mb: MicroBatch, prepared: PreparedBatch, cfg: Any) -> LossTerms:
    """The loss terms of ``mb`` given the policy's log-probs of its completions (see module doc)."""
    mask = mb.completion_mask
    reference, old = _frozen_slice(prepared.reference, mb), _frozen_slice(prepared.old, mb)
    finite = policy.finite
    for frozen in (reference, old):
        if frozen is not None:
            finite = finite & frozen.finite
    kept = (finite | ~mask).all(dim=1)
    token_mask = mask & kept[:, None]
    if prepared.in_loss is not None:
        token_mask = token_mask & prepared.in_loss[mb.rows, None]
    token_mask = token_mask.float()
    old_logp = old.logp if old is not None else policy.logp.detach()
    importance = None
    if mb.engine_logprobs is not None:
        old_logp, token_mask, importance = correct(policy, old_logp, mb, prepared.advantages[mb.rows], token_mask, cfg)
    out = POLICY_LOSSES[cfg.policy_loss].fn(
        PolicyLossInputs(policy.logp, old_logp, prepared.advantages[mb.rows], token_mask), cfg
    )
    # Only the policy term is weighted (the KL term is added after), as TRL and verl do.
    per_token = out.loss * importance.weights if importance is not None else out.loss

    aggregation = {}
    policy_term, aggregation["policy"] = aggregate_term("policy", per_token, token_mask, prepared, cfg)
    kl_term = kl_sum = torch.zeros((), device=per_token.device)
    loss = policy_term
    if reference is not None:
        kl = kl_estimate(policy.logp, reference.logp, cfg.kl_estimator)
        if cfg.kl_bias_correction:  # the reverse KL's gradient (algorithm/kl.py)
            kl = ratio_weighted(kl, policy.logp, old_logp, reference.logp)
        kl_term, aggregation["kl"] = aggregate_term("kl", kl, token_mask, prepared, cfg)
        loss = loss + cfg.beta * kl_term
        kl_sum = (kl.detach() * token_mask).sum()
    entropy = policy.entropy if policy.entropy is not None else torch.zeros_like(token_mask)
    entropy_term = None
    if getattr(cfg, "entropy_coef", 0.0) > 0:
        if not entropy.requires_grad and torch.is_grad_enabled() and policy.logp.requires_grad:
            raise ValueError("algorithm.entropy_coef > 0 needs the entropy with its gradient (entropy_grad=True)")
        entropy_term, aggregation["entropy"] = aggregate_term("entropy", entropy, token_mask, prepared, cfg)
        loss = loss - cfg.entropy_coef * entropy_term
    return LossTerms(
        loss=loss,
        policy=policy_term,
        kl=kl_term,
        aggregation=aggregation,
        kept=kept,
        token_mask=token_mask,
        seq_logp=torch.where(kept, (policy.logp.detach() * mask).sum(dim=1), torch.nan),
        kl_sum=kl_sum,
        entropy_sum=(entropy.detach() * token_mask).sum(),
        clip_low_sum=(out.clipped_low.float() * token_mask).sum(),
        clip_high_sum=(out.clipped_high.float() * token_mask).sum(),
        importance=importance,
        entropy=entropy_term,
    )
