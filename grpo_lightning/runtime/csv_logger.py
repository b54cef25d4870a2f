"""``ResumableCSVLogger``: a resumed run continues its CSV instead of starting ``version_1``.

Lightning's CSV logger deletes an existing ``metrics.csv`` when it opens its folder again, so
``trainer.resume`` either lost the earlier rows (same version) or split the run over two files
(the next version). This one keeps the rows, continues with their header, and drops rows after
the step the run resumed from (logged by the interrupted run, logged again now).
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


class _KeepingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:  # keep the rows; continue under their header
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as handle:
                self.metrics_keys = list(csv.DictReader(handle).fieldnames or [])

    def drop_after(self, step: int) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as handle:
            rows = list(csv.DictReader(handle))
        kept = [r for r in rows if not r.get("step") or float(r["step"]) <= step]
        if len(kept) < len(rows):
            with self._fs.open(self.metrics_file_path, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(kept)


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
