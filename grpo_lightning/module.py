"""``GRPOModule``: the GRPO optimization step as a LightningModule (manual optimization).

One training step consumes one generation batch (a :class:`RolloutBatch` handed over by the
rollout callback) and runs ``num_iterations`` optimizer passes over it:

1. group-relative advantages from the rewards;
2. the loss normalizer of the chosen aggregation mode, over the whole batch and all ranks;
3. reference log-probs (only when beta > 0) and old log-probs (only when num_iterations > 1),
   once, without gradient;
4. per pass: micro-batch forward, per-token clipped loss (times the truncated importance
   weight pi_old / pi_engine when ``is_level`` is not none) + beta x KL, aggregated with the
   global normalizer, backward; then the NaN guard, gradient clipping and the optimizer step.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import lightning as L
import torch
from torch import nn

from grpo_lightning.algorithm import (
    TokenLogProbs,
    aggregate,
    group_advantages,
    kl_estimate,
    lm_head_log_probs,
    loss_normalizer,
    policy_loss,
    selective_log_probs,
    truncated_importance_weights,
)
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.guards import NonFiniteCounters, NonFiniteTrainingError
from grpo_lightning.rollout.batch import RolloutBatch

# The frozen reference model is in eval mode on purpose (see GRPOModule.train); the policy's
# train mode is enforced in training_step, so this warning has nothing left to tell.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode", category=UserWarning)


@dataclass(frozen=True)
class AggregationRecord:
    """How one loss term was reduced to a scalar: the mode and the normalizer it divided by."""

    mode: str
    normalizer: float


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

    def token_mean(self, name: str) -> float:
        return getattr(self, name) / max(self.kept_tokens, 1.0)


# The PassStats fields summed over micro-batches on the device (read once per pass).
_PASS_SUMS = ("loss", "policy_loss", "kl_loss", "kl_sum", "kept_tokens", "entropy_sum", "clip_low_sum", "clip_high_sum")


@dataclass
class StepResult:
    """The outcome of one training step, kept on the module for callbacks (the health monitor)."""

    passes: list[PassStats] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one reason per skipped optimizer step
    advantages: torch.Tensor | None = None  # [N], as used by the loss (the F5 check reads them)


def _plain_output_head(model: nn.Module) -> nn.Linear | None:
    """The output head if logits are exactly ``head(decoder(x))`` (no soft-capping or scaling)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return head if isinstance(head, nn.Linear) and decoder is not None else None


class GRPOModule(L.LightningModule):
    """GRPO over a Hugging Face causal LM. ``policy`` is trained; a frozen copy is the reference."""

    def __init__(
        self,
        policy: nn.Module,
        algorithm: AlgorithmConfig | None = None,
        reference: nn.Module | None = None,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.cfg = algorithm or AlgorithmConfig()
        self.policy = policy
        self.reference = None
        if self.cfg.beta > 0:
            self.reference = reference if reference is not None else copy.deepcopy(policy)
            self.reference.requires_grad_(False).eval()
        self.counters = NonFiniteCounters()
        self.last_step: StepResult | None = None
        self._pending_rollout: RolloutBatch | None = None
        # Set by build_run (grpo_lightning.evaluation.Evaluator): what validation_step runs.
        self.evaluator = None
        self.save_hyperparameters({"algorithm": asdict(self.cfg)})

    def train(self, mode: bool = True) -> GRPOModule:
        """Lightning switches the whole module to train mode; the reference stays in eval (no dropout)."""
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()
        return self

    # ----------------------------------------------------------------------- hand-over
    def receive_rollout(self, rollout: RolloutBatch) -> None:
        """Called by the rollout callback before each training step."""
        self._pending_rollout = rollout

    def _take_rollout(self) -> RolloutBatch:
        if self._pending_rollout is None:
            raise RuntimeError(
                "GRPOModule.training_step found no RolloutBatch: add a RolloutCallback "
                "(grpo_lightning.callbacks.RolloutCallback) to the Trainer's callbacks"
            )
        rollout, self._pending_rollout = self._pending_rollout, None
        return rollout.to(self.device)

    # ----------------------------------------------------------------------- log-probs
    def completion_log_probs(
        self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
        prompt_width: int, temperature: float, with_entropy: bool = False,
    ) -> TokenLogProbs:
        """Float32 log-probs [B, C] of the completion tokens (columns from ``prompt_width`` on).

        Models with a plain linear output head go through the decoder and then the head a
        chunk of rows at a time (:func:`lm_head_log_probs`: no [B, T, V] logits tensor);
        others through their full logits, upcast a chunk at a time.
        """
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        targets = input_ids[:, prompt_width:]
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        head = _plain_output_head(model)
        if head is not None:
            hidden = model.get_decoder()(**inputs).last_hidden_state[:, prompt_width - 1 : -1]
            rows = self._chunk_rows(head.out_features)
            return lm_head_log_probs(hidden, head, targets, temperature, rows, with_entropy)
        logits = model(**inputs, logits_to_keep=targets.shape[1] + 1).logits[:, :-1]
        rows = self._chunk_rows(logits.shape[-1])
        return selective_log_probs(logits, targets, temperature, rows, with_entropy)

    def _chunk_rows(self, vocab_size: int) -> int:
        """Token positions per chunk so that their float32 logits fit ``logprob_chunk_mb``."""
        return max(1, int(self.cfg.logprob_chunk_mb * 2**20) // (4 * vocab_size))

    def _micro_batches(self, rollout: RolloutBatch):
        """Row slices of ``micro_batch_size``, each trimmed of all-padding columns."""
        ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        attn = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
        width = rollout.prompt_ids.shape[1]
        for start in range(0, rollout.num_sequences, self.cfg.micro_batch_size):
            rows = slice(start, start + self.cfg.micro_batch_size)
            prompt_used = rollout.prompt_mask[rows].any(dim=0).nonzero()
            first = int(prompt_used[0]) if len(prompt_used) else width
            completion_used = rollout.completion_mask[rows].any(dim=0).nonzero()
            num_cols = int(completion_used[-1]) + 1 if len(completion_used) else 1
            yield rows, num_cols, ids[rows, first : width + num_cols], attn[rows, first : width + num_cols], width - first

    @torch.no_grad()
    def _frozen_log_probs(self, model: nn.Module, rollout: RolloutBatch, batches: list) -> TokenLogProbs:
        """Log-probs of the whole batch without gradient (reference or old policy)."""
        shape = rollout.completion_ids.shape
        logp = torch.zeros(shape, device=self.device)
        finite = torch.ones(shape, dtype=torch.bool, device=self.device)
        for rows, num_cols, ids, attn, prompt_width in batches:
            out = self.completion_log_probs(model, ids, attn, prompt_width, rollout.temperature)
            logp[rows, :num_cols] = out.logp
            finite[rows, :num_cols] = out.finite
        return TokenLogProbs(logp=logp, entropy=None, finite=finite)

    # ----------------------------------------------------------------------- the step
    def _sum_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        if self._trainer is None or self.trainer.world_size == 1:
            return value
        return self.trainer.strategy.reduce(value, reduce_op="sum")

    def _world_size(self) -> int:
        return 1 if self._trainer is None else self.trainer.world_size

    def _backward(self, loss: torch.Tensor) -> None:
        if self._trainer is None:
            loss.backward()
        else:
            self.manual_backward(loss)

    def _no_sync(self, is_last: bool):
        """Skip DDP's gradient all-reduce on every micro-batch but the last."""
        block = getattr(self._trainer.strategy, "block_backward_sync", None) if self._trainer else None
        return nullcontext() if is_last or block is None else block()

    def prepare(self, rollout: RolloutBatch) -> dict:
        """Everything computed once per generation batch, before the first backward."""
        mask = rollout.completion_mask.float()
        # The micro-batch slices (trimmed of padding) serve the frozen passes and every
        # optimization pass alike: computed once.
        batches = list(self._micro_batches(rollout))
        return {
            "micro_batches": batches,
            "advantages": group_advantages(
                rollout.rewards, rollout.group_size, self.cfg.advantage_scale, self.cfg.advantage_eps
            ),
            "normalizer": self._sum_over_ranks(
                loss_normalizer(mask, self.cfg.loss_agg, rollout.max_new_tokens)
            ),
            "reference": self._frozen_log_probs(self.reference, rollout, batches) if self.reference is not None else None,
            "old": self._frozen_log_probs(self.policy, rollout, batches) if self.cfg.num_iterations > 1 else None,
        }

    def accumulate_gradients(self, rollout: RolloutBatch, prepared: dict) -> PassStats:
        """One pass: forward and backward over every micro-batch, gradients summed exactly.

        A sequence with a non-finite log-prob (policy, reference or old) is dropped from the
        loss; its rows never produce a gradient. A non-finite micro-batch loss marks the pass
        (the caller then skips the optimizer step) but is still back-propagated: under DDP a
        rank that skipped its backward would leave the others waiting in the gradient
        all-reduce forever, while its non-finite gradient reaches every rank, so all skip the
        step together. The statistics stay on the device and are read once per pass (no
        host sync per micro-batch).
        """
        cfg, stats = self.cfg, PassStats()
        scale = self._world_size()  # DDP averages gradients over ranks; we want their sum
        batches = prepared["micro_batches"]
        seq_logp = torch.full((rollout.num_sequences,), torch.nan, device=self.device)
        stats.seq_logp = seq_logp
        sums: list[torch.Tensor] = []  # per micro-batch, on the device
        for index, (rows, num_cols, ids, attn, prompt_width) in enumerate(batches):
            mask = rollout.completion_mask[rows, :num_cols].bool()
            out = self.completion_log_probs(
                self.policy, ids, attn, prompt_width, rollout.temperature, with_entropy=True
            )
            finite = out.finite
            for frozen in (prepared["reference"], prepared["old"]):
                if frozen is not None:
                    finite = finite & frozen.finite[rows, :num_cols]
            keep = (finite | ~mask).all(dim=1)
            token_mask = (mask & keep[:, None]).float()
            old = prepared["old"].logp[rows, :num_cols] if prepared["old"] is not None else out.logp.detach()
            pg = policy_loss(
                out.logp, old, prepared["advantages"][rows], cfg.clip_low, cfg.clip_high, cfg.dual_clip
            )
            seq_logp[rows] = torch.where(keep, (out.logp.detach() * mask).sum(dim=1), torch.nan)
            per_token = pg.loss
            if rollout.engine_logprobs is not None:
                per_token = self._importance_weighted(
                    per_token, old, rollout.engine_logprobs[rows, :num_cols], token_mask, stats
                )
            # Each term is aggregated on its own (the sum is linear, so the loss is the same)
            # so that the mode and normalizer of each can be checked (F5).
            policy_term = self._aggregate_term("policy", per_token, token_mask, prepared, rollout, stats)
            loss = policy_term
            kl_term = kl_sum = torch.zeros((), device=self.device)
            if prepared["reference"] is not None:
                kl = kl_estimate(out.logp, prepared["reference"].logp[rows, :num_cols], cfg.kl_estimator)
                kl_term = self._aggregate_term("kl", kl, token_mask, prepared, rollout, stats)
                loss = loss + cfg.beta * kl_term
                kl_sum = (kl.detach() * token_mask).sum()
            with self._no_sync(index == len(batches) - 1):
                self._backward(loss * scale)
            finite_loss = torch.isfinite(loss.detach())
            counted = {
                "loss": loss, "policy_loss": policy_term, "kl_loss": kl_term, "kl_sum": kl_sum,
                "kept_tokens": token_mask.sum(), "entropy_sum": (out.entropy * token_mask).sum(),
                "clip_low_sum": (pg.clipped_low.float() * token_mask).sum(),
                "clip_high_sum": (pg.clipped_high.float() * token_mask).sum(),
            }
            # A non-finite micro-batch adds nothing to the sums (the step is skipped anyway).
            sums.append(torch.stack([
                *(torch.where(finite_loss, counted[name].detach().float(), 0.0) for name in _PASS_SUMS),
                (~keep).sum().float(), (~finite_loss).float(),
            ]))
        if sums:
            *totals, dropped, nonfinite = torch.stack(sums).sum(dim=0).tolist()
            for name, total in zip(_PASS_SUMS, totals):
                setattr(stats, name, total)
            stats.dropped_seqs, stats.finite_loss = int(dropped), nonfinite == 0
        return stats

    def _importance_weighted(
        self, per_token: torch.Tensor, old: torch.Tensor, engine: torch.Tensor,
        token_mask: torch.Tensor, stats: PassStats,
    ) -> torch.Tensor:
        """Measure the engine/trainer mismatch; with ``is_level != none`` weight the policy term.

        Only the policy term is weighted (the KL term is added after), as TRL and verl do.
        With ``is_level == none`` the loss is returned untouched.
        """
        iw = truncated_importance_weights(old, engine, token_mask, self.cfg.is_level, self.cfg.is_cap)
        stats.engine_tokens += float(token_mask.sum())
        stats.logp_diff_sum += iw.abs_diff_sum
        stats.is_ratio_max = max(stats.is_ratio_max, iw.ratio_max)
        stats.is_truncated += iw.truncated
        return per_token if self.cfg.is_level == "none" else per_token * iw.weights

    def _aggregate_term(
        self, term: str, per_token: torch.Tensor, token_mask: torch.Tensor, prepared: dict,
        rollout: RolloutBatch, stats: PassStats,
    ) -> torch.Tensor:
        """Aggregate one loss term with the configured mode and the global normalizer, and
        record both on ``stats`` so the health monitor can check every term used the same (F5)."""
        normalizer = prepared["normalizer"]
        if term not in stats.aggregation:
            stats.aggregation[term] = AggregationRecord(self.cfg.loss_agg, float(normalizer))
        return aggregate(per_token, token_mask, self.cfg.loss_agg, normalizer, rollout.max_new_tokens)

    def _guarded_step(self, stats: PassStats, result: StepResult) -> None:
        """Step only with a finite loss and gradient; otherwise leave weights and optimizer untouched."""
        optimizer = self.optimizers()
        params = [p for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.tensor(0.0)
        result.grad_norms.append(float(grad_norm))
        reason = None
        if not stats.finite_loss:
            reason = "loss"
        elif not torch.isfinite(grad_norm):
            reason = "grad"
        elif stats.kept_tokens == 0:
            reason = "no_finite_sequence"
        if reason is None:
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.max_grad_norm, grad_norm)
            optimizer.step()
            self.lr_schedulers().step()
            self.counters.consecutive_skips = 0
        else:
            self.counters.record_skip(reason)
            result.skipped.append(reason)
        optimizer.zero_grad(set_to_none=True)
        if self.counters.consecutive_skips >= self.cfg.max_consecutive_skips:
            raise NonFiniteTrainingError(
                self.counters.diagnosis(reason, self.global_step, self.cfg.lr, self.cfg.beta)
            )

    def training_step(self, batch, batch_idx: int) -> None:
        # ``from_pretrained`` returns the policy in eval mode and Lightning (>= 2.2) no longer
        # switches modules to train mode at fit start; in eval mode gradient checkpointing
        # and dropout silently do nothing. A rollout engine or callback may also leave it so.
        if not self.policy.training:
            self.policy.train()
        rollout = self._take_rollout()
        prepared = self.prepare(rollout)
        result = StepResult(advantages=prepared["advantages"])
        self.optimizers().zero_grad(set_to_none=True)
        for _ in range(self.cfg.num_iterations):
            stats = self.accumulate_gradients(rollout, prepared)
            self.counters.nonfinite_seqs += stats.dropped_seqs
            result.passes.append(stats)
            self._guarded_step(stats, result)
        self.last_step = result
        self._log_step(rollout, prepared, result)

    # ----------------------------------------------------------------------- evaluation
    def validation_step(self, batch: list[dict], batch_idx: int) -> None:
        """Greedy (and pass@k) accuracy on held-out prompts; averaged over batches by their size."""
        if self.evaluator is None:
            return
        metrics = self.evaluator.evaluate(batch, step=self.global_step, rank=self.global_rank)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(batch), sync_dist=True)

    # ----------------------------------------------------------------------- logging
    def _log_step(self, rollout: RolloutBatch, prepared: dict, result: StepResult) -> None:
        last = result.passes[-1]
        grouped = rollout.rewards.view(-1, rollout.group_size)
        lengths = rollout.completion_mask.sum(dim=1).float()
        metrics = {
            "train/loss": last.loss,
            "train/grad_norm": result.grad_norms[-1],
            "train/lr": self.optimizers().param_groups[0]["lr"],
            "reward/mean": float(rollout.rewards.mean()),
            "reward/std": float(rollout.rewards.std()) if rollout.num_sequences > 1 else 0.0,
            "reward/frac_zero_std": float((grouped.std(dim=1) < 1e-6).float().mean()),
            "policy/entropy": last.token_mean("entropy_sum"),
            "policy/clip_frac_low": last.token_mean("clip_low_sum"),
            "policy/clip_frac_high": last.token_mean("clip_high_sum"),
            "completions/mean_length": float(lengths.mean()),
            "health/nonfinite_seqs": float(sum(p.dropped_seqs for p in result.passes)),
            "health/nonfinite_seqs_total": float(self.counters.nonfinite_seqs),
            "health/skipped_steps_total": float(self.counters.skipped_steps),
        }
        if last.engine_tokens > 0:
            metrics["rollout/logp_diff_mean"] = last.logp_diff_sum / last.engine_tokens
            metrics["rollout/is_ratio_max"] = last.is_ratio_max
            metrics["rollout/is_truncated_frac"] = last.is_truncated / last.engine_tokens
        if rollout.finished is not None:
            metrics["completions/clipped_frac"] = float((~rollout.finished).float().mean())
        if self.reference is not None:
            metrics["kl/mean"] = last.token_mean("kl_sum")
        for name, values in rollout.reward_components.items():
            metrics[f"reward/{name}/mean"] = float(values.mean())
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=rollout.num_sequences)
        shown = {"reward": metrics["reward/mean"]}
        if "kl/mean" in metrics:
            shown["kl"] = metrics["kl/mean"]
        self.log_dict(shown, prog_bar=True, logger=False, on_step=True, batch_size=rollout.num_sequences)

    # ----------------------------------------------------------------------- optimizer
    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )
        warmup = max(self.cfg.warmup_steps, 0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)) if warmup else 1.0
        )
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    # ----------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["grpo_counters"] = asdict(self.counters)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "grpo_counters" in checkpoint:
            self.counters = NonFiniteCounters(**checkpoint["grpo_counters"])
