"""F3: the bookkeeping of non-finite values, and the error that stops a run that keeps failing."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.errors import TrainingStopped


class NonFiniteTrainingError(TrainingStopped):
    """Training stopped because too many consecutive steps were non-finite; the message is the diagnosis."""


@dataclass
class NonFiniteCounters:
    """Running totals, logged as ``health/*`` and saved with checkpoints."""

    nonfinite_seqs: int = 0  # sequences dropped from the loss for non-finite log-probs
    nonfinite_losses: int = 0  # steps whose loss was non-finite
    nonfinite_grads: int = 0  # steps whose gradient norm was non-finite
    nonfinite_updates: int = 0  # steps whose update would have made a weight non-finite
    skipped_steps: int = 0  # optimizer steps not taken
    consecutive_skips: int = 0

    def record_skip(self, reason: str) -> None:
        self.skipped_steps += 1
        self.consecutive_skips += 1
        if reason == "loss":
            self.nonfinite_losses += 1
        elif reason == "grad":
            self.nonfinite_grads += 1
        elif reason == "update":
            self.nonfinite_updates += 1

    def diagnosis(self, reason: str, step: int, lr: float, beta: float) -> str:
        what = {
            "loss": "the loss was non-finite (NaN or inf)",
            "grad": "the gradient norm was non-finite (NaN or inf)",
            "no_finite_sequence": "every sequence of the batch had non-finite log-probs",
            "update": "the optimizer step would have made weights non-finite (NaN or inf) from finite gradients",
        }[reason]
        return (
            f"GRPO stopped at step {step}: {self.consecutive_skips} consecutive optimizer steps were "
            f"skipped because {what}. Totals so far: {self.skipped_steps} skipped steps, "
            f"{self.nonfinite_seqs} sequences dropped for non-finite log-probs, "
            f"{self.nonfinite_losses} non-finite losses, {self.nonfinite_grads} non-finite gradients, "
            f"{self.nonfinite_updates} steps refused for a non-finite update. "
            f"No non-finite value was written into the weights: they are as after the last good step. "
            f"Likely causes: a learning rate too high for this model (algorithm.lr={lr}), "
            f"fp16 overflow (use trainer.precision=bf16-mixed or 32-true), a policy that drifted far "
            f"from the reference (algorithm.beta={beta}; algorithm.kl_estimator=k3 is the most stable). "
            f"Try: lower algorithm.lr, lower algorithm.max_grad_norm, or raise "
            f"algorithm.max_consecutive_skips to ride out rare spikes."
        )
