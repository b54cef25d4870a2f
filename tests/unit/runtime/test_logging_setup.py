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
