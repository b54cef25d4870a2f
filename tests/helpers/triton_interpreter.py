"""Runs a kernel check script (``tests/helpers/*_check.py``) in Triton's CPU interpreter.

TRITON_INTERPRET must be set before Triton is imported, so each check runs in a process of its
own. Triton 3.6's interpreter stops on our kernels ("only 0-dimensional arrays can be converted
to Python scalars", seen on a GPU machine); 3.9's (this project's venv, through vLLM) runs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_check(script: str, cases: int) -> None:
    """Runs ``tests/helpers/<script>`` over ``cases`` random cases; fails the test with its output."""
    pytest.importorskip("triton", minversion="3.9")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(ROOT / "tests" / "helpers" / script), str(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.strip().endswith(f"checked {cases} cases")
