"""``LifecycleHooks``: what Lightning calls on :class:`~grpo_lightning.step.module.GRPOModule` around its
training step: the rollout engine's life cycle (setup, the weight push after each step, close),
validation, and the module's own state in a checkpoint.

A mixin, kept apart so ``module.py`` reads as the step alone; it relies on the module's
``rollout``, ``evaluator``, ``val_means``, ``counters``, ``totals`` and ``last_metrics``.
"""

from __future__ import annotations

from dataclasses import asdict

import lightning as L

from grpo_lightning.step.guards import NonFiniteCounters
from grpo_lightning.step.metrics import write_metrics
from grpo_lightning.step.weight_push import CloseRolloutOnException, push_weights


class LifecycleHooks:
    """Lightning's hooks outside ``training_step``; listed before ``L.LightningModule`` in the bases."""

    # ----------------------------------------------------------------------- rollout life cycle
    def setup(self, stage: str) -> None:
        if self.rollout is not None:
            self.rollout.setup(self.policy)

    def configure_callbacks(self) -> list[L.Callback]:
        return [CloseRolloutOnException(self.rollout)] if self.rollout is not None else []

    def on_train_start(self) -> None:
        # An engine started from another snapshot (or shared between runs) begins from this policy.
        if self.rollout is not None:
            push_weights(self, self.global_step, force=True)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """The last hop: after the monitor (callbacks run first), push the new weights to the
        engine; then the step's metrics, the sync's included, go to the loggers."""
        if self.rollout is not None:
            self.last_metrics.update(push_weights(self, self.global_step))
        write_metrics(self._trainer, self.last_metrics, self.global_step)

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
        weights = getattr(self.evaluator, "last_weights", None)  # a group's metrics weigh its own prompts
        self.val_means.update(metrics, len(batch), self.device, weights)

    def on_validation_epoch_end(self) -> None:
        """The ``val/*`` means over every rank's prompts (torchmetrics' sync), logged once, at the
        optimizer step of the weights they evaluated (``step``): the row of the step they follow
        (0 before training). Lightning's own step there is its count of finished batches, one
        behind inside the loop, so a validation after step k was written as a row of step k-1."""
        if self.val_means.means:
            self.log_dict({**self.val_means.compute(), "step": float(self.global_step)}, on_step=False, on_epoch=True)

    # ----------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["grpo_counters"] = asdict(self.counters)
        checkpoint["grpo_totals"] = self.totals.state_dict()
        if hasattr(self.rollout, "state_dict"):  # async generation: the batches in flight
            checkpoint["grpo_rollout"] = self.rollout.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "grpo_counters" in checkpoint:
            self.counters = NonFiniteCounters(**checkpoint["grpo_counters"])
        self.totals.load_state_dict(checkpoint.get("grpo_totals", {}))
        if "grpo_rollout" in checkpoint and hasattr(self.rollout, "load_state_dict"):
            self.rollout.load_state_dict(checkpoint["grpo_rollout"])
