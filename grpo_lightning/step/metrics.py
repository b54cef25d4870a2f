"""The step's metrics: computed once from its records, written straight to the loggers.

Straight to the loggers rather than through ``LightningModule.log``: Lightning's ``self.log``
moves each metric's whole state object to the device on every key and call, a visible share of
a small model's step for the module's keys (measured: benchmarks/results/LOG.md, "Other
measurements moved out of the code's docs"). Only
:data:`CALLBACK_METRICS` also go through ``self.log``, for callbacks and notebooks.
"""

from __future__ import annotations

import lightning as L

from grpo_lightning.records import PassStats, RolloutBatch, StepResult
from grpo_lightning.rewards.routing import source_reward_metrics
from grpo_lightning.step.guards import NonFiniteCounters
from grpo_lightning.step.reductions import StepStats

# The step metrics also given to Lightning's ``self.log`` (trainer.callback_metrics, for
# callbacks such as ModelCheckpoint(monitor=...) and notebooks; the first two on the progress
# bar). Every step metric goes to the loggers directly and is ``GRPOModule.last_metrics``.
CALLBACK_METRICS = ("reward/mean", "kl/mean", "reward/std", "train/loss")
PROGRESS_BAR_METRICS = ("reward/mean", "kl/mean")


class StepTotals:
    """The step's statistics over all ranks (:class:`StepStats`, torchmetrics) and the run's
    ``num_tokens`` so far (TRL's: prompt and completion tokens of every rank; checkpointed)."""

    def __init__(self) -> None:
        self.stats: StepStats | None = None
        self.num_tokens = 0.0
        self.step_tokens = 0.0  # of the last step measured, all ranks

    def measure(self, rollout: RolloutBatch, last: PassStats) -> dict[str, float]:
        names = tuple(rollout.reward_components)
        if self.stats is None or self.stats.reward_names != names:
            self.stats = StepStats(names)
        self.stats.to(rollout.rewards.device).reset()
        self.stats.update(rollout, last)
        out = self.stats.compute()  # every rank calls it in training_step: the sync is a collective
        self.step_tokens = out.pop("num_tokens_step")
        self.num_tokens += self.step_tokens
        out["num_tokens"] = self.num_tokens
        return out

    def state_dict(self) -> dict[str, float]:
        return {"num_tokens": self.num_tokens}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.num_tokens = float(state.get("num_tokens", 0.0))


def step_metrics(
    rollout: RolloutBatch,
    result: StepResult,
    counters: NonFiniteCounters,
    lr: float,
    global_step: int,
    with_kl: bool,
    totals: StepTotals | None = None,
    seconds: float | None = None,
) -> dict[str, float]:
    """train/*, reward/*, policy/*, completions/*, health/*, rollout/* and ``num_tokens`` of one step.

    ``lr`` is the rate the step's update used; ``seconds`` the step's wall time (rollout and
    update, not the weight sync: ``rollout/sync_seconds``). Reward, length, entropy, KL and
    clip values are over every rank (``totals``, torchmetrics); the rest are this rank's."""
    last = result.passes[-1]
    totals = totals or StepTotals()
    shared = totals.measure(rollout, last)
    step_tokens = totals.step_tokens
    kl = shared.pop("kl/mean")
    metrics = {
        **rollout.timing,
        "train/loss": last.loss,
        "train/grad_norm": result.grad_norms[-1],
        "train/lr": lr,
        **shared,
        "health/nonfinite_seqs": float(sum(p.dropped_seqs for p in result.passes)),
        "health/nonfinite_seqs_total": float(counters.nonfinite_seqs),
        "health/skipped_steps_total": float(counters.skipped_steps),
    }
    if rollout.finished is None:  # an engine that does not report EOS: no clipped or terminated lengths
        for key in [k for k in metrics if k.startswith("completions/") and ("clipped" in k or "terminated" in k)]:
            del metrics[key]
    if seconds is not None and seconds > 0:
        metrics["train/step_time"] = seconds
        metrics["train/tokens_per_s"] = step_tokens / seconds
    if last.engine_tokens > 0:
        metrics["rollout/logp_diff_mean"] = last.logp_diff_sum / last.engine_tokens
        metrics["rollout/is_ratio_max"] = last.is_ratio_max
        metrics["rollout/is_truncated_frac"] = last.is_truncated / last.engine_tokens
    if rollout.weight_version is not None:
        # Optimizer steps between the weights that sampled the batch and those it trains.
        metrics["rollout/weight_version_lag"] = float(global_step - rollout.weight_version)
    if with_kl:
        metrics["kl/mean"] = kl
    metrics.update(source_reward_metrics(rollout.sources, rollout.rewards, rollout.reward_components))  # task=mixed
    metrics.update(rollout.reward_metrics)  # log_metric of the reward functions (TRL), as reward/<name>
    return metrics


def log_callback_metrics(module: L.LightningModule, metrics: dict[str, float], batch_size: int) -> None:
    """The few metrics callbacks read from ``trainer.callback_metrics`` (not to the loggers)."""
    for key in CALLBACK_METRICS:
        if key in metrics:
            module.log(
                key,
                metrics[key],
                prog_bar=key in PROGRESS_BAR_METRICS,
                logger=False,
                on_step=True,
                on_epoch=False,
                batch_size=batch_size,
            )


def write_metrics(trainer: L.Trainer | None, metrics: dict[str, float], global_step: int) -> None:
    """``metrics`` to every logger, every ``trainer.log_every_n_steps`` generation batches and at
    the last one, one call each (the health monitor writes its own the same way)."""
    if trainer is None or not metrics or not trainer.loggers:
        return
    batches = trainer.fit_loop.total_batch_idx + 1
    last = trainer.max_steps > 0 and global_step >= trainer.max_steps
    if batches % max(trainer.log_every_n_steps, 1) and not (last or trainer.should_stop):
        return
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=global_step)
        logger.save()
