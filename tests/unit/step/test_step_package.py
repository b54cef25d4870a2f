"""The step package's import surface: GRPOModule on first use, the records' old path deprecated."""

from __future__ import annotations

import subprocess
import sys

import pytest

import grpo_lightning.records as records
import grpo_lightning.step as step


@pytest.mark.parametrize("name", ["Completion", "RolloutBatch", "StepResult", "PassStats", "StepContext"])
def test_the_records_old_path_returns_the_same_class_with_a_deprecation(name):
    with pytest.warns(DeprecationWarning, match=f"from grpo_lightning.records import {name}"):
        moved = getattr(step, name)
    assert moved is getattr(records, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        step.Nothing  # noqa: B018


def test_importing_the_step_package_or_the_records_imports_no_lightning():
    """Plug-ins import the records at any layer; the step package loads GRPOModule only on use."""
    code = (
        "import sys, grpo_lightning.step, grpo_lightning.records;"
        "print('lightning' in sys.modules, 'grpo_lightning.step.module' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_module_loads_on_first_use():
    from grpo_lightning.step.module import GRPOModule  # noqa: PLC0415  (the name under test loads lazily)

    assert step.GRPOModule is GRPOModule
