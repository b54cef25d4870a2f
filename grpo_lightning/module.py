"""``GRPOModule``: the GRPO optimization step as a LightningModule (manual optimization).

Data flows one way, and ``training_step`` reads it top to bottom:

1. **prompts**: the prompt loader's ``batch`` (records; or a ready :class:`RolloutBatch`);
2. **rollout**: the module's own :class:`RolloutGenerator` turns the records into a scored
   generation batch, with seeds of (run seed, rank, step, prompt, sample);
3. **prepare**: advantages (the registered ``algorithm.advantage_estimator``), the loss
   normalizer of the whole batch over all ranks, reference and old log-probs, once;
4. **step**: per pass, every micro-batch's loss (:func:`micro_batch_loss`: the registered
   ``algorithm.policy_loss``, KL, aggregation) is back-propagated; then the NaN guard,
   gradient clipping and the optimizer step. The result (rollout included) is ``last_step``;
5. **monitor**: callbacks (the HealthMonitor, the completions table) read ``last_step`` in
   ``on_train_batch_end``; they observe and never feed anything back;
6. **sync**: the module's ``on_train_batch_end`` (Lightning calls it after the callbacks')
   pushes the new weights into an engine that keeps its own (vLLM).

Why the module owns the generator rather than a callback handing it batches: each hop's
product is passed forward explicitly in one function, a plain ``Trainer`` with no callbacks
trains and validates (the evaluator uses the same generator), and user callbacks can be
added freely since none of them is load-bearing.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, replace

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from grpo_lightning.algorithm import (
    AggregationRecord,
    MicroBatch,
    PreparedBatch,
    TokenLogProbs,
    compute_advantages,
    loss_normalizer,
    micro_batch_loss,
    sequences_in_loss,
    tied_groups,
)
from grpo_lightning.algorithm.lr_schedule import lr_factor
from grpo_lightning.algorithm.packing import PackedMicroBatch
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.evaluation import Evaluator
from grpo_lightning.guards import NonFiniteCounters, NonFiniteTrainingError
from grpo_lightning.models.auto_checkpointing import CheckpointingChoice, choose_checkpointing, set_checkpointing
from grpo_lightning.models.forward import CompletionLogProbs
from grpo_lightning.models.lora import AdapterDisabledReference, is_peft_model, reference_model
from grpo_lightning.rollout.generator import RolloutGenerator
from grpo_lightning.sharding import DATA_PARALLEL, shard_module
from grpo_lightning.step import PassStats, RolloutBatch, StepContext, StepResult
from grpo_lightning.weight_push import push_weights

# The frozen reference model is in eval mode on purpose (see GRPOModule.train); the policy's
# train mode is enforced in training_step, so this warning has nothing left to tell.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode", category=UserWarning)


# The step metrics also given to Lightning's ``self.log`` (trainer.callback_metrics, for
# callbacks such as ModelCheckpoint(monitor=...) and notebooks; the first two on the progress
# bar). Every step metric goes to the loggers directly and is ``GRPOModule.last_metrics``.
CALLBACK_METRICS = ("reward/mean", "kl/mean", "reward/std", "train/loss")
_PROGRESS_BAR_METRICS = ("reward/mean", "kl/mean")

# The PassStats fields summed over micro-batches on the device (read once per pass).
_PASS_SUMS = ("loss", "policy_loss", "kl_loss", "kl_sum", "kept_tokens", "entropy_sum", "clip_low_sum", "clip_high_sum")


def _default_reference(policy: nn.Module):
    """The frozen reference: a LoRA policy's own base (adapters off, no copy), else a deep copy
    (in the policy's dtype)."""
    return AdapterDisabledReference(policy) if is_peft_model(policy) else copy.deepcopy(policy)


class _CloseRolloutOnException(L.Callback):
    """Lightning tells only callbacks about exceptions: drain the generator's queued work and
    release an engine it built (a launched vLLM server) then."""

    def __init__(self, rollout: RolloutGenerator):
        self.rollout = rollout

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.rollout.shutdown()


def adamw_can_fuse(params: list[torch.Tensor]) -> bool:
    """torch's fused AdamW (one kernel per parameter group: no per-parameter temporaries, a
    faster step; TRL's default) for plain floating-point tensors on CPU or CUDA. FSDP2's
    sharded parameters (DTensors) keep the default implementation."""
    return bool(params) and all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params
    )


class GRPOModule(L.LightningModule):
    """GRPO over a Hugging Face causal LM. ``policy`` is trained; a frozen copy is the reference
    (for a LoRA policy, the same base model with its adapters switched off).

    ``rollout`` generates each step's completions from the loader's prompt records (without
    one, the loader must yield :class:`RolloutBatch` objects). ``correctness_reward`` names
    the reward function whose score of 1 means correct; with it, validation reports
    ``val/accuracy`` (greedy) and ``val/pass@k`` (``eval_pass_k`` > 0) on held-out prompts.
    """

    def __init__(
        self,
        policy: nn.Module,
        algorithm: AlgorithmConfig | None = None,
        reference: nn.Module | None = None,
        *,
        rollout: RolloutGenerator | None = None,
        correctness_reward: str | None = None,
        eval_max_new_tokens: int | None = None,
        eval_pass_k: int = 0,
        auto_checkpointing: bool = False,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.cfg = algorithm or AlgorithmConfig()
        self.policy = policy
        self.reference = None
        if self.cfg.beta > 0:
            self.reference = reference if reference is not None else _default_reference(policy)
            self.reference.requires_grad_(False).eval()
        self.rollout = rollout
        self.evaluator: Evaluator | None = None
        if rollout is not None and correctness_reward is not None:
            self.evaluator = Evaluator(
                rollout,
                correctness_reward,
                eval_max_new_tokens or rollout.sampling.max_new_tokens,
                pass_k=eval_pass_k,
                seed=rollout.seed,
            )
        self.forward_pass = CompletionLogProbs(self.cfg.logprob_chunk_mb, self.cfg.pack_sequences)
        self.auto_checkpointing = auto_checkpointing
        self.checkpointing_choice: CheckpointingChoice | None = None  # auto's latest decision
        self.counters = NonFiniteCounters()
        self.last_step: StepResult | None = None
        self.last_metrics: dict[str, float] = {}  # every metric of the last step (see _log_step)
        self.save_hyperparameters({"algorithm": asdict(self.cfg)})

    def train(self, mode: bool = True) -> GRPOModule:
        """Lightning switches the whole module to train mode; the reference stays in eval (no dropout)."""
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()
        return self

    # ----------------------------------------------------------------------- the step
    def training_step(self, batch, batch_idx: int) -> None:
        # ``from_pretrained`` returns the policy in eval mode and Lightning (>= 2.2) no longer
        # switches modules to train mode at fit start; in eval mode gradient checkpointing
        # and dropout silently do nothing. A rollout engine may also leave it so.
        if not self.policy.training:
            self.policy.train()
        rollout = self.generate_rollout(batch)
        prepared = self.prepare(rollout)
        result = StepResult(advantages=prepared.advantages, rollout=rollout)
        if self.auto_checkpointing:
            self._choose_checkpointing(prepared)
        self.optimizers().zero_grad(set_to_none=True)
        for iteration in range(self.cfg.num_iterations):
            # The first pass's policy log-probs are the old policy's: later passes read them
            # instead of paying a separate forward before the first backward.
            record = iteration == 0 and self.cfg.num_iterations > 1
            stats = self.accumulate_gradients(rollout, prepared, record_old=record)
            if record:
                prepared = replace(prepared, old=stats.old_logprobs)
            self.counters.nonfinite_seqs += stats.dropped_seqs
            result.passes.append(stats)
            self._guarded_step(stats, result)
        self.last_step = result
        self._log_step(rollout, result)

    def step_context(self) -> StepContext:
        """The settings the last step ran under, for the health monitor (it reads no other module state)."""
        sampling = self.rollout.sampling if self.rollout is not None else None
        return StepContext(
            algorithm=self.cfg,
            lr=float(self.optimizers().param_groups[0]["lr"]),
            filtered_sampling=sampling is not None and (sampling.top_p < 1.0 or sampling.top_k > 0),
            correctness_reward=self.evaluator.correctness_reward if self.evaluator is not None else None,
            reward_weights={r.name: r.weight for r in self.rollout.scorer.rewards} if self.rollout is not None else {},
        )

    def generate_rollout(self, batch) -> RolloutBatch:
        """The generation batch of this step: ``batch`` itself if it is one, else generated from its prompts."""
        if isinstance(batch, RolloutBatch):
            return batch.to(self.device)
        if self.rollout is None:
            raise RuntimeError(
                "GRPOModule got prompt records but has no rollout generator: pass "
                "rollout=RolloutGenerator(...) to GRPOModule, or yield RolloutBatch objects from the loader"
            )
        # The count of generation batches, not global_step: a skipped optimizer step must not
        # repeat the previous step's seeds. Lightning restores it on resume.
        step = self.trainer.fit_loop.total_batch_idx
        rollout = self.rollout.rollout_for_step(batch, step=step, rank=self.global_rank)
        return rollout.to(self.device)

    def prepare(self, rollout: RolloutBatch) -> PreparedBatch:
        """Everything computed once per generation batch, before the first backward."""
        # The micro-batch slices (trimmed of padding) serve the frozen passes and every
        # optimization pass alike: computed once.
        batches = list(self._micro_batches(rollout))
        in_loss = sequences_in_loss(rollout, self.cfg)
        mask = rollout.trained_mask.float() * (in_loss[:, None] if in_loss is not None else 1.0)
        return PreparedBatch(
            micro_batches=batches,
            advantages=compute_advantages(rollout.rewards, rollout.group_size, self.cfg),
            normalizer=self._sum_over_ranks(loss_normalizer(mask, self.cfg.loss_agg, rollout.max_new_tokens)),
            max_new_tokens=rollout.max_new_tokens,
            reference=self._reference_log_probs(rollout, batches) if self.reference is not None else None,
            old=None,  # num_iterations > 1: recorded by the first pass (see training_step), not recomputed
            in_loss=in_loss,
        )

    def accumulate_gradients(
        self, rollout: RolloutBatch, prepared: PreparedBatch, record_old: bool = False
    ) -> PassStats:
        """One pass: forward and backward over every micro-batch, gradients summed exactly.

        A non-finite micro-batch loss marks the pass (the caller then skips the optimizer
        step) but is still back-propagated: under DDP a rank that skipped its backward would
        leave the others waiting in the gradient all-reduce forever, while its non-finite
        gradient reaches every rank, so all skip the step together. The statistics stay on
        the device and are read once per pass (no host sync per micro-batch). ``record_old``
        keeps the pass's policy log-probs (detached) as ``stats.old_logprobs``.
        """
        stats = PassStats()
        if record_old:
            shape = rollout.completion_ids.shape
            old = TokenLogProbs(
                logp=torch.zeros(shape, device=self.device),
                entropy=None,
                finite=torch.ones(shape, dtype=torch.bool, device=self.device),
            )
        scale = self._world_size()  # DDP averages gradients over ranks; we want their sum
        batches = prepared.micro_batches
        stats.seq_logp = torch.full((rollout.num_sequences,), torch.nan, device=self.device)
        sums: list[torch.Tensor] = []  # per micro-batch, on the device
        for index, mb in enumerate(batches):
            logprobs = self.completion_log_probs(
                self.policy,
                mb.input_ids,
                mb.attention_mask,
                mb.prompt_width,
                rollout.temperature,
                with_entropy=True,
                entropy_grad=self.cfg.entropy_coef > 0,
                packed=lambda: mb.packed,
            )
            terms = micro_batch_loss(logprobs, mb, prepared, self.cfg)
            if record_old:
                old.logp[mb.rows, : mb.num_cols] = logprobs.logp.detach()
                old.finite[mb.rows, : mb.num_cols] = logprobs.finite
            with self._no_sync(index == len(batches) - 1):
                self._backward(terms.loss * scale)
            stats.seq_logp[mb.rows] = terms.seq_logp
            if index == 0:  # one host read per pass
                stats.aggregation = {
                    term: AggregationRecord(rec.mode, float(rec.normalizer)) for term, rec in terms.aggregation.items()
                }
            if terms.importance is not None:
                self._record_importance(terms, stats)
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
            # A non-finite micro-batch adds nothing to the sums (the step is skipped anyway).
            sums.append(
                torch.stack(
                    [
                        *(torch.where(finite_loss, counted[name].detach().float(), 0.0) for name in _PASS_SUMS),
                        (~terms.kept).sum().float(),
                        (~finite_loss).float(),
                    ]
                )
            )
        if sums:
            *totals, dropped, nonfinite = torch.stack(sums).sum(dim=0).tolist()
            for name, total in zip(_PASS_SUMS, totals):
                setattr(stats, name, total)
            stats.dropped_seqs, stats.finite_loss = int(dropped), nonfinite == 0
        if record_old:
            stats.old_logprobs = old
        return stats

    @staticmethod
    def _record_importance(terms, stats: PassStats) -> None:
        """Engine vs trainer log-probs of the sampled tokens (rollout/logp_diff_mean, is_*)."""
        iw = terms.importance
        stats.engine_tokens += float(terms.token_mask.sum())
        stats.logp_diff_sum += iw.abs_diff_sum
        stats.is_ratio_max = max(stats.is_ratio_max, iw.ratio_max)
        stats.is_truncated += iw.truncated

    def _guarded_step(self, stats: PassStats, result: StepResult) -> None:
        """Step only with a finite loss and gradient; otherwise leave weights and optimizer untouched."""
        optimizer = self.optimizers()
        params = [p for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.tensor(0.0)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a replicated DTensor; clipping takes it as is
            result.grad_norms.append(float(grad_norm.full_tensor()))
        else:
            result.grad_norms.append(float(grad_norm))
        reason = None
        if not stats.finite_loss:
            reason = "loss"
        elif not math.isfinite(result.grad_norms[-1]):
            reason = "grad"
        elif stats.kept_tokens == 0:
            # No token in the loss: every sequence non-finite, or (mask_truncated) every one cut.
            reason = "no_finite_sequence" if stats.dropped_seqs else "nothing_in_loss"
        if reason == "nothing_in_loss":  # nothing to learn from, and nothing went wrong: no step, no alarm
            result.skipped.append(reason)
        elif reason is None:
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.max_grad_norm, grad_norm)
            optimizer.step()
            self.lr_schedulers().step()
            self.counters.consecutive_skips = 0
        else:
            self.counters.record_skip(reason)
            result.skipped.append(reason)
        optimizer.zero_grad(set_to_none=True)
        if self.counters.consecutive_skips >= self.cfg.max_consecutive_skips:
            raise NonFiniteTrainingError(self.counters.diagnosis(reason, self.global_step, self.cfg.lr, self.cfg.beta))

    # ----------------------------------------------------------------------- log-probs
    def completion_log_probs(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_width: int,
        temperature: float,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        packed: Callable[[], PackedMicroBatch] | None = None,
    ) -> TokenLogProbs:
        """Float32 log-probs [B, C] of the completion tokens (columns from ``prompt_width`` on),
        packed without padding when ``algorithm.pack_sequences`` (:class:`CompletionLogProbs`;
        ``packed`` returns the rows packed already)."""
        return self.forward_pass(
            model,
            input_ids,
            attention_mask,
            prompt_width,
            temperature,
            with_entropy,
            entropy_grad,
            packed=packed,
        )

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
            engine = rollout.engine_logprobs
            yield MicroBatch(
                rows=rows,
                input_ids=ids[rows, first : width + num_cols],
                attention_mask=attn[rows, first : width + num_cols],
                prompt_width=width - first,
                completion_mask=rollout.trained_mask[rows, :num_cols].bool(),
                engine_logprobs=engine[rows, :num_cols] if engine is not None else None,
            )

    def _reference_log_probs(self, rollout: RolloutBatch, batches: list[MicroBatch]) -> TokenLogProbs:
        """The reference's log-probs: its own model, or a LoRA policy with the adapters switched off."""
        with reference_model(self.reference) as model:
            return self._frozen_log_probs(model, rollout, batches)

    @torch.no_grad()
    def _frozen_log_probs(self, model: nn.Module, rollout: RolloutBatch, batches: list[MicroBatch]) -> TokenLogProbs:
        """Log-probs of the whole batch without gradient (reference or old policy)."""
        shape = rollout.completion_ids.shape
        logp = torch.zeros(shape, device=self.device)
        finite = torch.ones(shape, dtype=torch.bool, device=self.device)
        for mb in batches:
            out = self.completion_log_probs(
                model,
                mb.input_ids,
                mb.attention_mask,
                mb.prompt_width,
                rollout.temperature,
                packed=lambda: mb.packed,
            )
            logp[mb.rows, : mb.num_cols] = out.logp
            finite[mb.rows, : mb.num_cols] = out.finite
        return TokenLogProbs(logp=logp, entropy=None, finite=finite)

    def _choose_checkpointing(self, prepared: PreparedBatch) -> None:
        """model.gradient_checkpointing=auto: on when the largest micro-batch's activations would not
        fit; every rank takes the same choice (recomputation changes the collectives under FSDP)."""
        shapes = [self._forward_shape(mb) for mb in prepared.micro_batches]
        choice = choose_checkpointing(self.policy, *max(shapes, key=lambda shape: shape[0] * shape[1]), self.device)
        if self._world_size() > 1:
            on = bool(self._sum_over_ranks(torch.tensor(float(choice.on), device=self.device)) > 0)
            choice = replace(choice, on=on)
        if self.checkpointing_choice is None or self.checkpointing_choice.on != choice.on:
            rank_zero_info(choice.report())
        set_checkpointing(self.policy, choice.on)
        self.checkpointing_choice = choice

    def _forward_shape(self, mb: MicroBatch) -> tuple[int, int]:
        """[rows, width] the decoder computes for ``mb``: packed when packing is on."""
        if self.cfg.pack_sequences and self.forward_pass.packing_verified is not False:
            return tuple(mb.packed.input_ids.shape)
        return tuple(mb.input_ids.shape)

    # ----------------------------------------------------------------------- ranks
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

    # ----------------------------------------------------------------------- sharding
    def configure_model(self) -> None:
        """trainer.strategy=fsdp (Lightning's ModelParallelStrategy): shard policy and reference (FSDP2)."""
        mesh = getattr(self, "_device_mesh", None)
        if mesh is not None:
            shard_module(self, mesh[DATA_PARALLEL])

    # ----------------------------------------------------------------------- rollout life cycle
    def setup(self, stage: str) -> None:
        if self.rollout is not None:
            self.rollout.setup(self.policy)

    def configure_callbacks(self) -> list[L.Callback]:
        return [_CloseRolloutOnException(self.rollout)] if self.rollout is not None else []

    def on_train_start(self) -> None:
        # An engine started from another snapshot (or shared between runs) begins from this policy.
        if self.rollout is not None:
            push_weights(self, self.global_step, force=True)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """The last hop: after the monitor (callbacks run first), push the new weights to the
        engine; then the step's metrics, the sync's included, go to the loggers."""
        if self.rollout is not None:
            probe = self.last_step.rollout if self.last_step is not None else None
            self.last_metrics.update(push_weights(self, self.global_step, probe))
        self._write_step_metrics()

    def _write_step_metrics(self) -> None:
        """``last_metrics`` to every logger, every ``trainer.log_every_n_steps`` generation batches
        and at the last one, one call each (the health monitor writes its own the same way).

        Straight to the loggers rather than through ``self.log``: Lightning's ``self.log`` costs
        about 0.2 ms per key and call (it moves each metric's whole state object to the device),
        5 ms a step for this module's 25 keys, a tenth of a step of the tiny policy."""
        if self._trainer is None or not self.last_metrics or not self.trainer.loggers:
            return
        batches = self.trainer.fit_loop.total_batch_idx + 1
        last = self.trainer.max_steps > 0 and self.global_step >= self.trainer.max_steps
        if batches % max(self.trainer.log_every_n_steps, 1) and not (last or self.trainer.should_stop):
            return
        for logger in self.trainer.loggers:
            logger.log_metrics(self.last_metrics, step=self.global_step)
            logger.save()

    def on_train_end(self) -> None:
        if self.rollout is not None:
            self.rollout.close()

    # ----------------------------------------------------------------------- evaluation
    def validation_step(self, batch: list[dict], batch_idx: int) -> None:
        """Greedy (and pass@k) accuracy on held-out prompts; averaged over batches by their size."""
        if self.evaluator is None:
            raise RuntimeError(
                "validation needs GRPOModule(..., rollout=..., correctness_reward=<reward function name>) "
                "to score held-out prompts; or turn validation off with Trainer(limit_val_batches=0)"
            )
        metrics = self.evaluator.evaluate(batch, step=self.global_step, rank=self.global_rank)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(batch), sync_dist=True)

    # ----------------------------------------------------------------------- logging
    def _log_step(self, rollout: RolloutBatch, result: StepResult) -> None:
        last = result.passes[-1]
        lengths = rollout.completion_mask.sum(dim=1).float()
        metrics = {
            **rollout.timing,
            "train/loss": last.loss,
            "train/grad_norm": result.grad_norms[-1],
            "train/lr": self.optimizers().param_groups[0]["lr"],
            "reward/mean": float(rollout.rewards.mean()),
            "reward/std": float(rollout.rewards.std()) if rollout.num_sequences > 1 else 0.0,
            "reward/frac_zero_std": float(tied_groups(rollout.rewards, rollout.group_size).float().mean()),
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
        if rollout.weight_version is not None:
            # Optimizer steps between the weights that sampled the batch and those it trains.
            metrics["rollout/weight_version_lag"] = float(self.global_step - rollout.weight_version)
        if rollout.finished is not None:
            metrics["completions/clipped_frac"] = float((~rollout.finished).float().mean())
        if self.reference is not None:
            metrics["kl/mean"] = last.token_mean("kl_sum")
        for name, values in rollout.reward_components.items():
            metrics[f"reward/{name}/mean"] = float(values.nanmean())  # NaN: the function skipped the sample
        self.last_metrics = metrics  # to the loggers after the weight sync (on_train_batch_end)
        for key in CALLBACK_METRICS:
            if key in metrics:
                self.log(
                    key,
                    metrics[key],
                    prog_bar=key in _PROGRESS_BAR_METRICS,
                    logger=False,
                    on_step=True,
                    on_epoch=False,
                    batch_size=rollout.num_sequences,
                )

    # ----------------------------------------------------------------------- optimizer
    def configure_optimizers(self):
        trained = [p for p in self.policy.parameters() if p.requires_grad]  # every weight, or the LoRA adapters
        optimizer = torch.optim.AdamW(
            trained, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, fused=adamw_can_fuse(trained) or None
        )
        warmup, schedule = max(self.cfg.warmup_steps, 0), self.cfg.lr_schedule
        total = self.trainer.max_steps if self._trainer is not None and self.trainer.max_steps > 0 else 0
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, functools.partial(lr_factor, schedule=schedule, warmup=warmup, total=total)
        )
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    # ----------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["grpo_counters"] = asdict(self.counters)
        if hasattr(self.rollout, "state_dict"):  # async generation: the batches in flight
            checkpoint["grpo_rollout"] = self.rollout.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "grpo_counters" in checkpoint:
            self.counters = NonFiniteCounters(**checkpoint["grpo_counters"])
        if "grpo_rollout" in checkpoint and hasattr(self.rollout, "load_state_dict"):
            self.rollout.load_state_dict(checkpoint["grpo_rollout"])
