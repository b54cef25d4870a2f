"""docs/configuration.md is generated from the schema and stays so; ``grpo-lightning help GROUP``
shows each field with its one-line help; no help text states a measurement."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from grpo_lightning import train
from grpo_lightning.config import TASKS, AlgorithmConfig, TrainConfig
from grpo_lightning.config_docs import COMMAND, group_names, group_table, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
# A number with a unit of time, memory or share, or a FLOP rate: a measurement, which belongs in docs/performance.md.
MEASUREMENT = re.compile(r"\d\s?(ms|s|MB|GB|MiB|GiB|%)(\b|\))|FLOP/s|tokens/s")


def _fields(instance, prefix=""):
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            yield from _fields(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f.metadata.get("help", "")


def _every_field():
    yield from _fields(TrainConfig())
    for name in TASKS.names:
        options = TASKS.options(name)
        if options is not None and options.__module__.startswith("grpo_lightning."):  # not a test's plug-in
            yield from _fields(options(), "task.")


def test_configuration_md_is_generated_from_the_current_schema():
    assert DOC.read_text() == render(), f"docs/configuration.md is stale: run `{COMMAND}`"


def test_every_field_is_in_the_reference_with_its_help():
    text = DOC.read_text()
    for key, help_text in _every_field():
        assert f"| `{key}` |" in text, key
        assert help_text, f"{key} has no help text"


def test_no_help_text_states_a_measurement():
    measured = {key: h for key, h in _every_field() if MEASUREMENT.search(h)}
    assert not measured, f"move the numbers to docs/performance.md, keep the why: {measured}"


def test_the_measurement_pattern_catches_measurements():
    assert MEASUREMENT.search("about 0.2 ms per key") and MEASUREMENT.search("-27% (4564 -> 3326 MB)")
    assert not MEASUREMENT.search("Operands run from 0 to this value; 0 turns it off (3 x 8 tokens).")


def _cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", "help", *args])
    with pytest.raises(SystemExit) as stop:
        train.cli()
    out = capsys.readouterr()
    return stop.value.code, out.out, out.err


def test_help_group_prints_each_field_with_its_one_line_help(monkeypatch, capsys):
    code, out, _ = _cli(monkeypatch, capsys, "algorithm")
    assert code == 0
    for f in dataclasses.fields(AlgorithmConfig):
        if dataclasses.is_dataclass(getattr(AlgorithmConfig(), f.name)):  # a nested group: its own table
            assert f"### algorithm.{f.name}" in out
            continue
        line = next(line for line in out.splitlines() if line.startswith(f"| `algorithm.{f.name}` |"))
        assert f.metadata["help"].replace("|", "\\|") in line
    assert out.strip() == group_table("algorithm").strip()


def test_help_lists_the_groups_and_refuses_an_unknown_one(monkeypatch, capsys):
    code, out, _ = _cli(monkeypatch, capsys)
    assert code == 0 and all(group in out for group in group_names())
    code, out, err = _cli(monkeypatch, capsys, "algoritm")
    assert code == 2 and "no config group 'algoritm'" in err and "algorithm" in err and not out


def test_help_of_a_task_shows_its_own_options(monkeypatch, capsys):
    code, out, _ = _cli(monkeypatch, capsys, "task.arithmetic")
    assert code == 0 and "`task.max_operand`" in out and "`task.rewards`" not in out
