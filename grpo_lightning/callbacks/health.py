"""``HealthMonitor``: runs the health checks after every training step and tells the user what
is wrong and what to change, before hours are lost.

Per step: build a :class:`StepView` from the module's ``last_step`` (the step's result and
the generation batch it trained on); every check measures local sums; one all-reduce adds them over
ranks (so every rank reaches the same verdict); every check evaluates the totals. A check
that finds a problem ``patience`` steps in a row raises an alert: ``warn`` (a rank-zero
warning with the diagnosis and ``health/alert/<check>`` = 1), ``raise`` (every rank stops
with :class:`HealthCheckError`), or ``ignore``. ``alerts`` keeps every alert of the run.
"""

from __future__ import annotations

import time
from collections import deque

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from grpo_lightning.config import HEALTH_CHECKS, HealthConfig
from grpo_lightning.health import Alert, HealthCheck, HealthCheckError, HealthWarning, StepView
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.fingerprints import TextHashes
from grpo_lightning.records.plain_state import RefusedState, from_plain, to_plain


class HealthMonitor(L.Callback):
    def __init__(self, config: HealthConfig | None = None, checks: list[HealthCheck] | None = None):
        self.config = config or HealthConfig()
        if checks is None:
            checks = [check_cls(getattr(self.config, name)) for name, check_cls in HEALTH_CHECKS.items()]
        self.checks = [c for c in checks if c.action != "ignore"]
        self.alerts: list[Alert] = []
        self.last_metrics: dict[str, float] = {}
        self.active: dict[str, bool] = {c.name: False for c in self.checks}
        self._streak: dict[str, int] = {c.name: 0 for c in self.checks}
        self._announced = False
        self._text_hashes = TextHashes()
        self.seconds = 0.0  # wall time spent in the monitor's hooks (the benchmark reads it)
        self.cpu_seconds = 0.0  # CPU time of this thread in the hooks (robust on a shared machine)
        self.steps = 0
        self._val_prompts = 0  # held-out prompts of the current validation run, on this rank

    # ----------------------------------------------------------------------- hooks
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        for check in self.checks:
            check.before_step(pl_module.policy)
        self.seconds += time.perf_counter() - start
        self.cpu_seconds += time.thread_time() - cpu

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            view = self._view(trainer, pl_module)
            if view is not None:
                self.run_checks(view, trainer, pl_module)
        finally:
            self.seconds += time.perf_counter() - start
            self.cpu_seconds += time.thread_time() - cpu
            self.steps += 1

    # ----------------------------------------------------------------------- held-out evaluation
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_prompts = 0

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._val_prompts += len(batch) if hasattr(batch, "__len__") else 0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Checks that read held-out accuracy (``observe_validation``) get it after every validation."""
        accuracy = trainer.callback_metrics.get("val/accuracy")
        prompts = self._val_prompts * trainer.world_size
        if accuracy is None or not prompts or trainer.sanity_checking:
            return
        for check in self.checks:
            finding = check.observe_validation(float(accuracy), prompts, trainer.global_step)
            if finding is not None:
                causes, fix = check.diagnosis(None)
                alert = Alert(
                    check.name,
                    check.failure,
                    check.title,
                    trainer.global_step,
                    finding.evidence,
                    causes,
                    fix,
                    finding.values,
                )
                self.alerts.append(alert)
                if check.action == "raise":
                    raise HealthCheckError(alert)
                rank_zero_warn(alert.text, category=HealthWarning)

    # ----------------------------------------------------------------------- the work
    def _view(self, trainer: L.Trainer, pl_module: L.LightningModule) -> StepView | None:
        result = pl_module.last_step
        if result is None or result.rollout is None or not result.passes:
            return None
        rollout = result.rollout
        world = trainer.world_size
        gather = None
        if world > 1:
            device = pl_module.device

            def gather(array: np.ndarray) -> np.ndarray:
                return trainer.strategy.all_gather(torch.from_numpy(array).to(device)).cpu().numpy()

        return StepView(
            step=rollout.step,  # the generation batch: the step of the seeds and of the data
            rollout=rollout,
            result=result,
            context=pl_module.step_context(),
            rank=trainer.global_rank,
            world_size=world,
            all_gather=gather,
            text_hashes=self._text_hashes,
        )

    def _sum_over_ranks(self, local: list[dict[str, float]], trainer: L.Trainer, device) -> list[dict[str, float]]:
        if trainer.world_size == 1:
            return local
        flat = torch.tensor([v for d in local for v in d.values()], dtype=torch.float64, device=device)
        total = trainer.strategy.reduce(flat, reduce_op="sum").cpu().tolist()
        out, i = [], 0
        for d in local:
            out.append(dict(zip(d, total[i : i + len(d)], strict=True)))
            i += len(d)
        return out

    def run_checks(self, view: StepView, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        local = [check.measure(view) for check in self.checks]
        totals = self._sum_over_ranks(local, trainer, pl_module.device)
        metrics: dict[str, float] = {}
        to_raise: Alert | None = None
        for check, t in zip(self.checks, totals, strict=True):
            values, finding = check.evaluate(t, view)
            for key, value in values.items():
                metrics[f"health/{check.name}/{key}"] = float(value)
            self._streak[check.name] = self._streak[check.name] + 1 if finding else 0
            if finding and self._streak[check.name] == check.patience:
                causes, fix = check.diagnosis(view)
                alert = Alert(
                    check.name, check.failure, check.title, view.step, finding.evidence, causes, fix, finding.values
                )
                self.alerts.append(alert)
                if check.action == "raise" and to_raise is None:
                    to_raise = alert
                else:
                    rank_zero_warn(alert.text, category=HealthWarning)
            self.active[check.name] = self._streak[check.name] >= check.patience
            metrics[f"health/alert/{check.name}"] = float(self.active[check.name])
        self._announce()
        self.last_metrics = metrics
        if view.step % self.config.log_every_n_steps == 0 or to_raise is not None:
            # Straight to the loggers: LightningModule.log costs about a millisecond per key
            # (more than all the checks together), and these values are already global.
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        if to_raise is not None:
            raise HealthCheckError(to_raise)

    def _announce(self) -> None:
        """Log the aggregation mode and its normalizer once (the F5 choice made visible)."""
        if self._announced:
            return
        for check in self.checks:
            line = check.announced
            if line:
                rank_zero_info(f"[grpo_lightning health] {line}")
                self._announced = True

    # ----------------------------------------------------------------------- checkpoints
    # The monitor's memory (alert streaks, alerts so far, each check's windows and
    # remembered completions) goes into the checkpoint, so a resumed run judges its steps as
    # the uninterrupted one does. The parameter snapshot of F4 is retaken before every step.
    # Saved as plain data (plain_state), which loads without running code.
    _NOT_SAVED = ("cfg", "snapshot")

    def state_dict(self) -> dict:
        checks = {c.name: {k: v for k, v in vars(c).items() if k not in self._NOT_SAVED} for c in self.checks}
        state = {
            "alerts": self.alerts,
            "active": self.active,
            "streak": self._streak,
            "announced": self._announced,
            "checks": checks,
        }
        return to_plain(state, "the health monitor's state")

    def load_state_dict(self, state_dict: dict) -> None:
        if "pickled" in state_dict:
            raise RefusedState.pickled("health monitor state")
        state = from_plain(state_dict, classes=(Alert, Finding))
        self.alerts, self.active, self._streak = state["alerts"], state["active"], state["streak"]
        self._announced = state["announced"]
        for check in self.checks:
            saved = state["checks"].get(check.name, {})
            for key, value in saved.items():  # a window changed on resume: its length is the config's now
                fresh = vars(check).get(key)
                if isinstance(fresh, deque) and isinstance(value, deque) and fresh.maxlen != value.maxlen:
                    saved[key] = deque(value, maxlen=fresh.maxlen)
            vars(check).update(saved)

    # ----------------------------------------------------------------------- reading
    def alerts_for(self, check: str) -> list[Alert]:
        return [a for a in self.alerts if a.check == check]
