"""The step's metrics: computed once from its records, written straight to the loggers.

Straight to the loggers rather than through ``LightningModule.log``: Lightning's ``self.log``
moves each metric's whole state object to the device on every key and call, a visible share of
a small model's step for the module's keys (measured: docs/performance.md). Only
:data:`CALLBACK_METRICS` also go through ``self.log``, for callbacks and notebooks.
"""

from __future__ import annotations

import lightning as L

from grpo_lightning.algorithm import tied_groups
from grpo_lightning.guards import NonFiniteCounters
from grpo_lightning.rewards.routing import source_reward_metrics
from grpo_lightning.step import RolloutBatch, StepResult

# The step metrics also given to Lightning's ``self.log`` (trainer.callback_metrics, for
# callbacks such as ModelCheckpoint(monitor=...) and notebooks; the first two on the progress
# bar). Every step metric goes to the loggers directly and is ``GRPOModule.last_metrics``.
CALLBACK_METRICS = ("reward/mean", "kl/mean", "reward/std", "train/loss")
PROGRESS_BAR_METRICS = ("reward/mean", "kl/mean")


def step_metrics(
    rollout: RolloutBatch,
    result: StepResult,
    counters: NonFiniteCounters,
    lr: float,
    global_step: int,
    with_kl: bool,
) -> dict[str, float]:
    """train/*, reward/*, policy/*, completions/*, health/* and rollout/* of one step."""
    last = result.passes[-1]
    lengths = rollout.completion_mask.sum(dim=1).float()
    metrics = {
        **rollout.timing,
        "train/loss": last.loss,
        "train/grad_norm": result.grad_norms[-1],
        "train/lr": lr,
        "reward/mean": float(rollout.rewards.mean()),
        "reward/std": float(rollout.rewards.std()) if rollout.num_sequences > 1 else 0.0,
        "reward/frac_zero_std": float(tied_groups(rollout.rewards, rollout.group_size).float().mean()),
        "policy/entropy": last.token_mean("entropy_sum"),
        "policy/clip_frac_low": last.token_mean("clip_low_sum"),
        "policy/clip_frac_high": last.token_mean("clip_high_sum"),
        "completions/mean_length": float(lengths.mean()),
        "health/nonfinite_seqs": float(sum(p.dropped_seqs for p in result.passes)),
        "health/nonfinite_seqs_total": float(counters.nonfinite_seqs),
        "health/skipped_steps_total": float(counters.skipped_steps),
    }
    if last.engine_tokens > 0:
        metrics["rollout/logp_diff_mean"] = last.logp_diff_sum / last.engine_tokens
        metrics["rollout/is_ratio_max"] = last.is_ratio_max
        metrics["rollout/is_truncated_frac"] = last.is_truncated / last.engine_tokens
    if rollout.weight_version is not None:
        # Optimizer steps between the weights that sampled the batch and those it trains.
        metrics["rollout/weight_version_lag"] = float(global_step - rollout.weight_version)
    if rollout.finished is not None:
        metrics["completions/clipped_frac"] = float((~rollout.finished).float().mean())
    if with_kl:
        metrics["kl/mean"] = last.token_mean("kl_sum")
    for name, values in rollout.reward_components.items():
        metrics[f"reward/{name}/mean"] = float(values.nanmean())  # NaN: the function skipped the sample
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
