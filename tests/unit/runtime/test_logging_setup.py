"""The console's filters drop third-party notes and keep what matters; a resumed CSV keeps its rows."""

from __future__ import annotations

import csv
import logging

from grpo_lightning.runtime.csv_logger import ResumableCSVLogger, csv_version
from grpo_lightning.runtime.logging_setup import NoiseFilter


def record(message: str, level: int = logging.INFO, name: str = "lightning.pytorch.utilities.rank_zero"):
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_noise_is_dropped_and_everything_else_kept():
    quiet = NoiseFilter()
    for noise in (
        "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](https://pypi.org)",
        "`Trainer(limit_val_batches=1.0)` was configured so 100% of the batches will be used..",
        "The following callbacks returned in `LightningModule.configure_callbacks` will override existing callbacks",
        "TPU available: False, using: 0 TPU cores",
    ):
        assert not quiet.filter(record(noise)), noise
    for kept in ("GPU available: True (cuda), used: True", "`Trainer.fit` stopped: `max_steps=3` reached."):
        assert quiet.filter(record(kept))
    assert quiet.filter(record("RotaryEmbedding failed to load", logging.ERROR))  # errors always pass


def test_vllm_warnings_pass_once_and_rotary_notes_never():
    vllm = NoiseFilter(once=True)
    warning = record("Custom op RotaryEmbedding was not registered", logging.WARNING, "vllm.custom_op")
    assert not vllm.filter(warning)
    doubt = "This model does not officially support disabling chunked prefill. Disabling this manually may ..."
    assert not vllm.filter(record(doubt, logging.WARNING, "vllm.engine.arg_utils"))  # off on a CPU on purpose
    repeated = record("max_num_batched_tokens is low", logging.WARNING, "vllm.config")
    assert vllm.filter(repeated) and not vllm.filter(repeated)
    info = record("Loading weights took 1 s", logging.INFO, "vllm.loader")
    assert vllm.filter(info) and vllm.filter(info)  # only warnings are deduplicated


def test_a_resumed_csv_keeps_its_rows_and_drops_those_after_the_checkpoint(tmp_path):
    first = ResumableCSVLogger(tmp_path, name="csv")
    for step in (1, 2, 3):
        first.log_metrics({"loss": float(step)}, step=step)
    first.save()
    assert csv_version(tmp_path / "csv", resuming=False) is None
    version = csv_version(tmp_path / "csv", resuming=True)
    assert version == 0
    again = ResumableCSVLogger(tmp_path, name="csv", version=version)
    again.drop_after(2)  # the checkpoint was at step 2; step 3 is logged again
    for step in (3, 4):
        again.log_metrics({"loss": float(step), "new": 1.0}, step=step)
    again.save()
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert rows[0]["new"] == "" and rows[3]["new"] == "1.0"


def _rows(tmp_path) -> list[dict]:
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def test_every_call_for_a_step_joins_that_steps_row(tmp_path):
    """The module, the health monitor and a validation log the same step apart: one row each step."""
    logger = ResumableCSVLogger(tmp_path, name="csv")
    logger.log_metrics({"val/accuracy": 0.1}, step=0)  # the baseline evaluation
    logger.save()
    for step in (1, 2, 3):
        logger.log_metrics({"health/x": float(step)}, step=step)  # not saved yet: joined in memory
        logger.log_metrics({"train/loss": float(step), "health/x": 10.0 * step}, step=step)  # the later value wins
        logger.save()
        if step in (2, 3):  # after the save: joins the row in the file, a new column included
            logger.log_metrics({"val/accuracy": step / 10, "val/new": 1.0}, step=step)
            logger.save()
    rows = _rows(tmp_path)
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    assert [r["val/accuracy"] for r in rows] == ["0.1", "", "0.2", "0.3"]
    assert [r["train/loss"] for r in rows] == ["", "1.0", "2.0", "3.0"]
    assert [r["health/x"] for r in rows] == ["", "10.0", "20.0", "30.0"]
    assert [r["val/new"] for r in rows] == ["", "", "1.0", "1.0"]

    resumed = ResumableCSVLogger(tmp_path, name="csv", version=0)
    resumed.drop_after(2)  # the checkpoint of step 2: step 3 is trained (and validated) again
    resumed.log_metrics({"train/loss": 33.0}, step=3)
    resumed.save()
    resumed.log_metrics({"val/accuracy": 0.4}, step=3)
    resumed.save()
    rows = _rows(tmp_path)
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    assert (rows[3]["train/loss"], rows[3]["val/accuracy"], rows[3]["health/x"]) == ("33.0", "0.4", "")
    assert rows[2]["val/accuracy"] == "0.2"
