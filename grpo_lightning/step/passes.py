"""``PassRecorder``: the bookkeeping of one pass over the generation batch.

The module's pass loop runs forward and backward per micro-batch; this records what each
micro-batch's :class:`LossTerms` measured into one :class:`PassStats`. The sums stay on
the device and are read once per pass (no host sync per micro-batch); a non-finite
micro-batch adds nothing to them (the optimizer step is skipped anyway).
"""

from __future__ import annotations

import torch

from grpo_lightning.algorithm.corrections import Correction
from grpo_lightning.algorithm.mismatch import correction_flags, mismatch_sums
from grpo_lightning.algorithm.objective import LossTerms, MicroBatch
from grpo_lightning.records import AggregationRecord, PassStats, RolloutBatch, TokenLogProbs

# The PassStats fields summed over micro-batches on the device (read once per pass).
PASS_SUMS = ("loss", "policy_loss", "kl_loss", "kl_sum", "kept_tokens", "entropy_sum", "clip_low_sum", "clip_high_sum")


class PassRecorder:
    """Collects one pass's statistics; ``record_old`` also keeps the pass's policy log-probs (detached)."""

    def __init__(self, shape: torch.Size, device: torch.device, record_old: bool = False):
        self.stats = PassStats()
        self.stats.seq_logp = torch.full((shape[0],), torch.nan, device=device)
        self.sums: list[torch.Tensor] = []  # per micro-batch, on the device
        self.old = None
        if record_old:
            self.old = TokenLogProbs(
                logp=torch.zeros(shape, device=device),
                entropy=None,
                finite=torch.ones(shape, dtype=torch.bool, device=device),
            )

    def add(self, mb: MicroBatch, logprobs: TokenLogProbs, terms: LossTerms) -> None:
        stats = self.stats
        if self.old is not None:
            self.old.logp[mb.rows, : mb.num_cols] = logprobs.logp.detach()
            self.old.finite[mb.rows, : mb.num_cols] = logprobs.finite
        stats.seq_logp[mb.rows] = terms.seq_logp
        if not self.sums:  # one host read per pass
            stats.aggregation = {
                term: AggregationRecord(rec.mode, float(rec.normalizer)) for term, rec in terms.aggregation.items()
            }
        if terms.importance is not None:  # engine vs trainer log-probs (rollout/logp_diff_mean, is_*)
            iw = terms.importance
            stats.engine_tokens += float(terms.token_mask.sum())
            stats.logp_diff_sum += iw.abs_diff_sum
            stats.is_ratio_max = max(stats.is_ratio_max, iw.ratio_max)
            stats.is_truncated += iw.truncated
        finite_loss = torch.isfinite(terms.loss.detach())
        counted = {
            "loss": terms.loss,
            "policy_loss": terms.policy,
            "kl_loss": terms.kl,
            "kl_sum": terms.kl_sum,
            "kept_tokens": terms.token_mask.sum(),
            "entropy_sum": terms.entropy_sum,
            "clip_low_sum": terms.clip_low_sum,
            "clip_high_sum": terms.clip_high_sum,
        }
        self.sums.append(
            torch.stack(
                [
                    *(torch.where(finite_loss, counted[name].detach().float(), 0.0) for name in PASS_SUMS),
                    (~terms.kept).sum().float(),
                    (~finite_loss).float(),
                ]
            )
        )

    def finish(self) -> PassStats:
        stats = self.stats
        if self.sums:
            *totals, dropped, nonfinite = torch.stack(self.sums).sum(dim=0).tolist()
            for name, total in zip(PASS_SUMS, totals, strict=True):
                setattr(stats, name, total)
            stats.dropped_seqs, stats.finite_loss = int(dropped), nonfinite == 0
        stats.old_logprobs = self.old
        return stats


def version_lag(rollout: RolloutBatch, trainer_version: int) -> torch.Tensor | None:
    """[N, C] (or [1]) optimizer steps between the weights that sampled each token and ``trainer_version``;
    None where the engine samples from the policy itself (lag 0)."""
    if rollout.token_weight_versions is not None:
        versions = rollout.token_weight_versions
        return torch.where(versions >= 0, trainer_version - versions, 0).clamp(min=0)
    if rollout.weight_version is not None:
        return torch.tensor([max(trainer_version - rollout.weight_version, 0)], device=rollout.completion_ids.device)
    return None


def measure_mismatch(
    rollout: RolloutBatch,
    logprobs: TokenLogProbs | None,
    trainer_version: int,
    corrections: list[Correction],
    advantages: torch.Tensor | None = None,
) -> dict[str, float]:
    """The engine-trainer mismatch totals of the step (``algorithm/mismatch.py``), from the first pass's
    log-probs (before the update): no extra forward. ``corrections`` (``selected_corrections``) decide the
    band and mask fractions as in that pass's loss (there, in both modes, "train" is these log-probs).
    Empty when the engine reported no log-probs."""
    if rollout.engine_logprobs is None or logprobs is None:
        return {}
    mask = rollout.trained_mask.bool() & logprobs.finite
    flags = correction_flags(corrections, logprobs.logp, rollout.engine_logprobs, mask, advantages)
    return mismatch_sums(logprobs.logp, rollout.engine_logprobs, mask, version_lag(rollout, trainer_version), flags)
