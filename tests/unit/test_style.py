"""ruff's lint rules ([tool.ruff.lint]: E, F, I, B, UP and PLC0415 against in-function imports)
and its formatter hold where make lint checks them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).parent / "ruff"


def lint_paths() -> list[str]:
    """The Makefile's LINT_PATHS: what make lint runs ruff check on."""
    found = re.search(r"^LINT_PATHS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile no longer sets LINT_PATHS"
    return found.group(1).split()


def test_make_lint_covers_the_package_tests_examples_and_benchmarks():
    assert set(lint_paths()) >= {"grpo_lightning", "tests", "examples", "benchmarks"}


# The same paths as make lint: lint rules on the code, the formatter on everything (notebooks and
# Markdown code blocks included).
@pytest.mark.parametrize("command", [["check", *lint_paths()], ["format", "--check", "."]])
def test_ruff_is_clean(command):
    if not RUFF.exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    result = subprocess.run([str(RUFF), *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
