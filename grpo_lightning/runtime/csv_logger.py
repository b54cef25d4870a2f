"""``ResumableCSVLogger``: one row per step, and a resumed run continues its CSV instead of
starting ``version_1``.

Lightning's CSV logger writes a row per ``log_metrics`` call: a step's own metrics, the health
monitor's and a validation after the step made two or three rows with the same ``step``, each
with a part of the columns. Here a call for the step of the last row joins that row (the later
value wins a column both set), so each step is one row with all its columns.

Lightning's CSV logger also deletes an existing ``metrics.csv`` when it opens its folder again,
so ``trainer.resume`` either lost the earlier rows (same version) or split the run over two
files (the next version). This one keeps the rows, continues with their header, and drops rows
after the step the run resumed from (logged by the interrupted run, logged again now).
"""

from __future__ import annotations

import csv
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


def csv_version(csv_dir: str | Path, resuming: bool) -> int | None:
    """A resumed run appends to its newest version; None starts the next one."""
    if not resuming:
        return None
    numbers = sorted(int(p.name[8:]) for p in Path(csv_dir).glob("version_*") if p.name[8:].isdigit())
    return numbers[-1] if numbers else None


def _same_step(a: dict, b: dict) -> bool:
    """Whether two rows (from memory, or read back as text) are of the same step."""
    return a.get("step") not in (None, "") and b.get("step") not in (None, "") and float(a["step"]) == float(b["step"])


class _KeepingWriter(ExperimentWriter):
    _last: dict | None = None  # the file's last row: a later call for its step joins it

    def _check_log_dir_exists(self) -> None:  # keep the rows; continue under their header
        if self._fs.isfile(self.metrics_file_path):
            rows = self._read()
            self._last = rows[-1] if rows else None

    def _read(self) -> list[dict]:
        with self._fs.open(self.metrics_file_path, "r", newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
        self.metrics_keys = list(reader.fieldnames or [])
        return rows

    def _write(self, rows: list[dict]) -> None:
        with self._fs.open(self.metrics_file_path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows)

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics_dict, step)
        if len(self.metrics) > 1 and _same_step(self.metrics[-2], self.metrics[-1]):
            self.metrics[-2].update(self.metrics.pop())  # not written yet: joined in memory

    def save(self) -> None:
        if not self.metrics:
            return
        if (
            self._last is not None
            and _same_step(self._last, self.metrics[0])
            and self._fs.isfile(self.metrics_file_path)
        ):
            # the step's row is in the file already (a validation after the step's own metrics):
            # rewrite the file with the row joined, as Lightning does when the header grows
            earlier = self._read()[:-1]
            self.metrics[0] = {**self._last, **self.metrics[0]}
            self._record_new_keys()
            self._write(earlier + self.metrics)
            self._last, self.metrics = self.metrics[-1], []
            return
        self._last = self.metrics[-1]
        super().save()

    def drop_after(self, step: int) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        rows = self._read()
        kept = [r for r in rows if not r.get("step") or float(r["step"]) <= step]
        self._last = kept[-1] if kept else None
        if len(kept) < len(rows):
            self._write(kept)


class ResumableCSVLogger(CSVLogger):
    @property
    @rank_zero_experiment
    def experiment(self) -> _KeepingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _KeepingWriter(log_dir=self.log_dir)
        return self._experiment

    def drop_after(self, step: int) -> None:
        """Forget rows logged after ``step`` (the checkpoint a resumed run starts from)."""
        self.experiment.drop_after(step)
