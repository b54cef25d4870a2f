"""``RunReport``: the run reports itself in its output folder, also offline and without wandb.

At every checkpoint and when the run ends (the final evaluation included) it writes

- ``report.png``: reward (mean, per function), KL, entropy, completion length, held-out
  accuracy, step time, the learning rate, and the health alerts as red lines at their steps;
- ``summary.json``: final and best metrics, the first and last held-out evaluation (``held_out``:
  before and after), steps, tokens, wall time, alerts, and where the model, checkpoints, metrics
  and log are (the CLI prints these places as its last lines);
- ``completions.jsonl``: every ``every_n_steps`` generation batches, sample prompts and
  completions with each reward function's score, the total and the advantage (the wandb
  completions table's content, appended), with the columns reward functions gave ``log_extra``;
  an episode's line holds its turns (role, text, tokens, loss_mask; log-prob sums and tool calls with
  their outcomes on the model's turns), stop reason, turn count, tool outcomes, rewards and info.

It only observes (global rank zero writes), and keeps its history in the checkpoint, so a
resumed run's report covers the whole run.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from grpo_lightning.callbacks.completions_table import completion_rows
from grpo_lightning.callbacks.report_plot import draw_report

REPORT, SUMMARY, SAMPLES = "report.png", "summary.json", "completions.jsonl"
# The step metrics the report keeps per step (a prefix ends with "/"): what the picture and the summary read.
KEPT = ("reward/", "kl/", "policy/entropy", "completions/", "train/", "num_tokens", "rollout/episodes/")
# Best values the summary names, and whether higher is better.
BEST = {"reward/mean": True, "val/accuracy": True, "val/reward": True, "val/success": True, "kl/mean": False}


def _clean(value):
    """JSON has no NaN: a skipped value is null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunReport(L.Callback):
    def __init__(
        self,
        output_dir: str | Path,
        every_n_steps: int = 10,
        max_rows: int = 16,
        health=None,
        checkpoints=None,
        draw: bool = True,
    ):
        self.output_dir = Path(output_dir)
        self.every_n_steps = every_n_steps
        self.max_rows = max_rows
        self.health = health  # the HealthMonitor, for its alerts (None: no health checks)
        self.checkpoints = checkpoints  # RunCheckpoints, for where the checkpoints and hf/ exports are
        self.draw = draw  # report.png (logger.report_png); summary.json is written either way
        self.history: list[dict] = []  # one row per generation batch: step and the KEPT metrics
        self.validations: list[dict] = []  # one row per held-out evaluation
        self.earlier_seconds = 0.0  # wall time of the run before a resume
        self.samples_written = 0
        self._start = time.perf_counter()
        self._fit_done = False
        self._logger_paths: dict[str, str] = {}

    # ----------------------------------------------------------------------- state (resume)
    def state_dict(self) -> dict:
        return {
            "history": self.history,
            "validations": self.validations,
            "seconds": self.wall_seconds(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))
        self.validations = list(state_dict.get("validations", []))
        self.earlier_seconds = float(state_dict.get("seconds", 0.0))

    def wall_seconds(self) -> float:
        return self.earlier_seconds + time.perf_counter() - self._start

    # ----------------------------------------------------------------------- hooks
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._fit_done = time.perf_counter(), False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A resumed run: the history and the CSV continue from the checkpoint's step."""
        step = trainer.global_step
        self.history = [row for row in self.history if row["step"] <= step]
        if step > 0:
            for logger in trainer.loggers:
                if hasattr(logger, "drop_after"):
                    logger.drop_after(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not trainer.is_global_zero:
            return
        metrics = getattr(pl_module, "last_metrics", {})
        row = {"step": trainer.global_step, "batch": trainer.fit_loop.total_batch_idx}
        row.update({k: _clean(float(v)) for k, v in metrics.items() if k.startswith(KEPT)})
        self.history.append(row)
        step = pl_module.last_step
        if self.every_n_steps > 0 and batch_idx % self.every_n_steps == 0 and step is not None and step.rollout:
            self.write_samples(step.rollout, step.advantages.cpu())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        values = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if values:
            self.validations = [v for v in self.validations if v["step"] != trainer.global_step]
            self.validations.append({"step": trainer.global_step, **values})
        if self._fit_done:  # the evaluation after fit: the report includes it
            self.write(trainer, "finished")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        if trainer.is_global_zero:
            self.write(trainer, "running")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_done = True
        if trainer.is_global_zero:
            interrupted = self.checkpoints is not None and self.checkpoints.interrupted is not None
            self.write(trainer, "interrupted" if interrupted else "finished")

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        if trainer.is_global_zero and self.history:
            try:
                self.write(trainer, f"failed: {type(exception).__name__}")
            except Exception as err:  # noqa: BLE001  (the run's own error is the one to report)
                rank_zero_warn(f"could not write the run's report after the failure: {type(err).__name__}: {err}")

    # ----------------------------------------------------------------------- writing
    def write_samples(self, rollout, advantages) -> None:
        columns, rows = completion_rows(rollout, advantages, self.max_rows)
        functions = [c for c in columns if c.startswith("reward/")]
        extra = getattr(rollout, "reward_extra", None) or {}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / SAMPLES, "a", encoding="utf-8") as handle:
            for i, values in enumerate(rows):  # row i is completion i of the batch
                record = dict(zip(columns, values, strict=True))
                record["rewards"] = {c.split("/", 1)[1]: _clean(record.pop(c)) for c in functions}
                # TRL's log_extra columns, each beside the completion it describes (prefixed on a clash)
                record.update({(f"log_extra/{c}" if c in record else c): v[i] for c, v in extra.items()})
                if getattr(rollout, "episodes", None):  # the turns as data: role, text, tokens, loss_mask, ...
                    record.update(rollout.episodes[i])
                line = json.dumps({k: _clean(v) for k, v in record.items()}, ensure_ascii=False, default=str)
                handle.write(line + "\n")
        self.samples_written += len(rows)

    def write(self, trainer: L.Trainer, status: str) -> dict:
        """summary.json and report.png as of now; returns the summary."""
        summary = self.summary(trainer, status)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.output_dir / f".{SUMMARY}.tmp"
        tmp.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(self.output_dir / SUMMARY)
        title = f"{self.output_dir}   |   {summary['steps']} steps, {summary['wall_seconds']:.0f} s, {status}"
        alerts = summary["alerts"]
        if self.history and self.draw:
            draw_report(self.output_dir / REPORT, self.history, self.validations, alerts, title)
        return summary

    def summary(self, trainer: L.Trainer, status: str) -> dict:
        final = dict(self.history[-1]) if self.history else {}
        final.pop("step", None)
        if self.validations:
            final.update({k: v for k, v in self.validations[-1].items() if k != "step"})
        best = {}
        for key, higher in BEST.items():
            rows = [r for r in (self.validations if key.startswith("val/") else self.history) if r.get(key) is not None]
            if rows:
                pick = (max if higher else min)(rows, key=lambda r, k=key: r[k])
                best[key] = {"value": pick[key], "step": pick["step"]}
        # An alert names its generation batch; the picture's axis is the optimizer step after it.
        steps = {row.get("batch"): row["step"] for row in self.history}
        alerts = [
            {"check": a.check, "failure": a.failure, "title": a.title, "step": steps.get(a.step, a.step)}
            | {"generation_batch": a.step, "evidence": a.evidence}
            for a in (self.health.alerts if self.health is not None else [])
        ]
        return {
            "status": status,
            "steps": trainer.global_step,
            "generation_batches": len(self.history),
            "num_tokens": final.get("num_tokens"),
            "wall_seconds": round(self.wall_seconds(), 1),
            "final": final,
            "best": best,
            "held_out": before_after(self.validations),
            "alerts": alerts,
            "outputs": self.outputs(trainer),
        }

    def outputs(self, trainer: L.Trainer) -> dict[str, str]:
        """Where this run's outputs are, in the order the console lists them."""
        out = self.output_dir
        places = {"report": out / REPORT} if self.draw else {}
        places["summary"] = out / SUMMARY
        if self.samples_written or (out / SAMPLES).exists():
            places["samples"] = out / SAMPLES
        if (out / "hf" / "final").is_dir():
            places["model"] = out / "hf" / "final"
        ckpt = self.checkpoints.last_checkpoint if self.checkpoints is not None else None
        if ckpt is not None:
            places["checkpoint"] = ckpt
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                places["metrics"] = Path(logger.log_dir) / "metrics.csv"
            elif isinstance(logger, WandbLogger) and logger._experiment is not None:
                places["wandb"] = Path(logger.experiment.dir).parent
        if (out / "train.log").exists():
            places["log"] = out / "train.log"
        return {k: str(v) for k, v in places.items()}


def before_after(validations: list[dict]) -> dict:
    """The first and the last held-out evaluation (before and after training when eval.before_training)."""
    if not validations:
        return {}
    first, last = validations[0], validations[-1]
    return {"before": dict(first), "after": dict(last)}


def output_lines(summary: dict) -> list[str]:
    """The console's last lines: where each output went."""
    width = max((len(k) for k in summary.get("outputs", {})), default=0)
    return [f"  {name:<{width}}  {path}" for name, path in summary.get("outputs", {}).items()]


def saved_outputs(output_dir: str | Path) -> list[str]:
    """:func:`output_lines` of the run's ``summary.json`` (global rank zero; none elsewhere or without one)."""
    path = Path(output_dir) / SUMMARY
    if rank_zero_only.rank != 0 or not path.is_file():
        return []
    return output_lines(json.loads(path.read_text()))
