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

The hooks around the step (engine life cycle, validation, checkpoint state) are the
:class:`~grpo_lightning.step.hooks.LifecycleHooks` mixin.

The module owns the generator (no callback hands it batches): each hop's product is passed on
in one function, and a plain ``Trainer`` with no callbacks trains and validates.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, replace
from functools import partial

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from grpo_lightning.algorithm import (
    MicroBatch,
    PreparedBatch,
    TokenLogProbs,
    compute_advantages,
    loss_normalizer,
    micro_batch_loss,
    sequences_in_loss,
)
from grpo_lightning.algorithm.corrections import selected_corrections
from grpo_lightning.algorithm.mismatch import mismatch_metrics
from grpo_lightning.algorithm.packing import PackedMicroBatch
from grpo_lightning.algorithm.truncation import Truncation, replayed_truncation
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.evaluation import Evaluator
from grpo_lightning.models.allocator import trim_heap
from grpo_lightning.models.auto_checkpointing import CheckpointingChoice, choose_checkpointing, set_checkpointing
from grpo_lightning.models.forward import CompletionLogProbs
from grpo_lightning.models.lora import AdapterDisabledReference, is_peft_model, reference_model
from grpo_lightning.models.sharding import DATA_PARALLEL, shard_module
from grpo_lightning.records import PassStats, RolloutBatch, StepContext, StepResult
from grpo_lightning.rollout.generator import RolloutGenerator
from grpo_lightning.step.guards import NonFiniteCounters, NonFiniteTrainingError
from grpo_lightning.step.hooks import LifecycleHooks
from grpo_lightning.step.metrics import CALLBACK_METRICS, StepTotals, log_callback_metrics, step_metrics
from grpo_lightning.step.micro_batches import frozen_log_probs, micro_batches
from grpo_lightning.step.optim import adamw_can_fuse, build_optimizer
from grpo_lightning.step.passes import PassRecorder, measure_mismatch
from grpo_lightning.step.reductions import ValidationMeans
from grpo_lightning.step.update_check import nonfinite_update_count

# Re-exported: the records and helpers that used to live here keep their import path.
__all__ = ["CALLBACK_METRICS", "GRPOModule", "PassStats", "StepResult", "adamw_can_fuse"]

# The frozen reference model is in eval mode on purpose (see GRPOModule.train); the policy's
# train mode is enforced in training_step, so this warning has nothing left to tell.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode", category=UserWarning)


def _default_reference(policy: nn.Module):
    """The frozen reference: a LoRA policy's base (adapters off, no copy), else a deep copy that shares the
    policy's frozen parameters (a VLM's frozen vision tower: equal forever, so one copy and, per step,
    one computation of a prompt's image features serve both)."""
    if is_peft_model(policy):
        return AdapterDisabledReference(policy)
    return copy.deepcopy(policy, memo={id(p): p for p in policy.parameters() if not p.requires_grad})


class GRPOModule(LifecycleHooks, L.LightningModule):
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
        self.forward_pass = CompletionLogProbs(
            self.cfg.logprob_chunk_mb, self.cfg.pack_sequences, self.cfg.head_kernels
        )
        self.replay = replayed_truncation(rollout, self.cfg)  # the engine's top-k / top-p, scored alike
        self.auto_checkpointing = auto_checkpointing
        self.checkpointing_choice: CheckpointingChoice | None = None  # auto's latest decision
        self.counters = NonFiniteCounters()
        self.last_step: StepResult | None = None
        self.last_metrics: dict[str, float] = {}  # every metric of the last step (see _log_step)
        self.totals = StepTotals()  # cross-rank step statistics (torchmetrics) and the run's num_tokens
        self.val_means = ValidationMeans()  # val/* over ranks and batches (torchmetrics)
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
        start, lr = time.perf_counter(), self.optimizers().param_groups[0]["lr"]  # the lr this step's update uses
        rollout = self.generate_rollout(batch)
        prepared = self.prepare(rollout)
        result = StepResult(advantages=prepared.advantages, rollout=rollout)
        if self.auto_checkpointing:
            self._choose_checkpointing(prepared)
        self.optimizers().zero_grad(set_to_none=True)
        version = self.global_step  # the trainer's weights before the update (a rollout's lag is relative to them)
        for iteration in range(self.cfg.num_iterations):
            # The first pass's policy log-probs are the old policy's: later passes read them
            # instead of paying a separate forward before the first backward; the mismatch too.
            record = iteration == 0 and (self.cfg.num_iterations > 1 or rollout.engine_logprobs is not None)
            stats = self.accumulate_gradients(rollout, prepared, record_old=record)
            if record:
                corrections = selected_corrections(self.cfg)
                result.mismatch = measure_mismatch(
                    rollout, stats.old_logprobs, version, corrections, prepared.advantages
                )
                prepared = replace(prepared, old=stats.old_logprobs) if self.cfg.num_iterations > 1 else prepared
            self.counters.nonfinite_seqs += stats.dropped_seqs
            result.passes.append(stats)
            self._guarded_step(stats, result)
        self.last_step = result
        with_kl, seconds = self.reference is not None, time.perf_counter() - start
        result.metrics = step_metrics(
            rollout, result, self.counters, lr, self.global_step, with_kl, self.totals, seconds
        )
        result.metrics.update(mismatch_metrics(result.mismatch) if result.mismatch else {})
        self.last_metrics = result.metrics  # to the loggers after the weight sync (on_train_batch_end)
        log_callback_metrics(self, result.metrics, rollout.num_sequences)

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
        self.rollout.trainer_version = self.global_step  # the weights a batch's staleness is counted from
        rollout = self.rollout.rollout_for_step(batch, step=step, rank=self.global_rank)
        trim_heap()  # generation's freed blocks back to the OS before the training passes (allocator.py)
        return rollout.to(self.device)

    def prepare(self, rollout: RolloutBatch) -> PreparedBatch:
        """Everything computed once per generation batch, before the first backward."""
        # The micro-batch slices (trimmed of padding) serve the frozen passes and every
        # optimization pass alike: computed once.
        # auto reads the width; every rank takes the widest rank's (under FSDP each pass is collectives:
        # the ranks must run as many micro-batches).
        width = self._max_over_ranks(rollout.used_width) if self.cfg.micro_batch_size == "auto" else 0
        size = self.cfg.micro_batch(rollout.num_sequences, width)
        batches = list(micro_batches(rollout, size))
        in_loss = sequences_in_loss(rollout, self.cfg)
        mask = rollout.trained_mask.float() * (in_loss[:, None] if in_loss is not None else 1.0)
        reference = self._reference_log_probs(rollout, batches) if self.reference is not None else None
        trim_heap()  # the reference pass's freed blocks back to the OS before the training forward
        return PreparedBatch(
            micro_batches=batches,
            advantages=compute_advantages(rollout.rewards, rollout.group_size, self.cfg),
            normalizer=self._sum_over_ranks(loss_normalizer(mask, self.cfg.loss_agg, rollout.max_new_tokens)),
            max_new_tokens=rollout.max_new_tokens,
            reference=reference,
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
        recorder = PassRecorder(rollout.completion_ids.shape, self.device, record_old)
        scale = self._world_size()  # DDP averages gradients over ranks; we want their sum
        batches = prepared.micro_batches
        for index, mb in enumerate(batches):
            logprobs = self.completion_log_probs(
                self.policy,
                mb.input_ids,
                mb.attention_mask,
                mb.prompt_width,
                rollout.temperature,
                with_entropy=True,
                entropy_grad=self.cfg.entropy_coef > 0,
                packed=lambda mb=mb: mb.packed,
                truncation=self.replay,
                vision=mb.vision,
            )
            terms = micro_batch_loss(logprobs, mb, prepared, self.cfg)
            # The forward's freed blocks (checkpointed layers, logit chunks) back to the OS before the
            # backward makes the gradients: on a LoRA step the heap held ~270 MB free there (allocator.py).
            trim_heap()
            with self._no_sync(index == len(batches) - 1):
                self._backward(terms.loss * scale)
            recorder.add(mb, logprobs, terms)
        return recorder.finish()

    def _guarded_step(self, stats: PassStats, result: StepResult) -> None:
        """Step only with a finite loss and gradient; otherwise leave weights and optimizer untouched."""
        trim_heap()  # the backward's freed blocks back to the OS before the optimizer's state and temporaries
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
        if reason is None:
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.max_grad_norm, grad_norm)
            # Finite gradients can still make a non-finite step (a huge lr): tried first, per tensor.
            if float(self._sum_over_ranks(nonfinite_update_count(getattr(optimizer, "optimizer", optimizer)))) > 0:
                reason = "update"
        if reason == "nothing_in_loss":  # nothing to learn from, and nothing went wrong: no step, no alarm
            result.skipped.append(reason)
        elif reason is None:
            optimizer.step()
            self.lr_schedulers().step()
            self.counters.consecutive_skips = 0
        else:
            self.counters.record_skip(reason)
            result.skipped.append(reason)
        optimizer.zero_grad(set_to_none=True)
        trim_heap()  # the passes' freed blocks back to the OS before the next rollout (allocator.py)
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
        truncation: Truncation | None = None,
        vision: list | None = None,
    ) -> TokenLogProbs:
        """Float32 log-probs [B, C] of the completion tokens (columns from ``prompt_width`` on),
        packed without padding when ``algorithm.pack_sequences`` (:class:`CompletionLogProbs`;
        ``packed`` returns the rows packed already; ``truncation``: the sampling filter replayed;
        ``vision``: each row's images, for a vision-language policy)."""
        args = (model, input_ids, attention_mask, prompt_width, temperature, with_entropy, entropy_grad)
        return self.forward_pass(*args, packed=packed, truncation=truncation, vision=vision)

    def _frozen_log_probs(self, model: nn.Module, rollout: RolloutBatch, batches: list[MicroBatch]) -> TokenLogProbs:
        return frozen_log_probs(partial(self.completion_log_probs, truncation=self.replay), model, rollout, batches)

    def _reference_log_probs(self, rollout: RolloutBatch, batches: list[MicroBatch]) -> TokenLogProbs:
        """The reference's log-probs: its own model, or a LoRA policy with the adapters switched off."""
        with reference_model(self.reference) as model:
            return self._frozen_log_probs(model, rollout, batches)

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

    def _max_over_ranks(self, value: int) -> int:
        if self._trainer is None or self.trainer.world_size == 1:
            return value
        return int(self.trainer.strategy.reduce(torch.tensor(float(value), device=self.device), reduce_op="max"))

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

    # ----------------------------------------------------------------------- optimizer
    def configure_optimizers(self):
        total = self.trainer.max_steps if self._trainer is not None and self.trainer.max_steps > 0 else 0
        return build_optimizer(self.policy, self.cfg, total)
