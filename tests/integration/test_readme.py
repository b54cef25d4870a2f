"""The README's Python examples, and those of the docs the README sends a newcomer to, run as
written (a README that is true)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Docs whose Python blocks are whole programs (moved out of the README; docs/real_runs.md holds fragments).
RUNNABLE_DOCS = ("docs/python_api.md", "docs/algorithm.md")


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


BLOCKS = python_blocks(README)
DOC_BLOCKS = [(doc, i) for doc in RUNNABLE_DOCS for i in range(len(python_blocks(ROOT / doc)))]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, tmp_path):
    assert len(BLOCKS) >= 3
    run_block(BLOCKS[index], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "index"), DOC_BLOCKS)
def test_docs_python_block_runs(doc, index, tmp_path):
    assert len(DOC_BLOCKS) >= 2  # the hand-assembled module and the policy-loss example
    run_block(python_blocks(ROOT / doc)[index], tmp_path)


def run_block(block: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + block)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "WANDB_MODE": "offline",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            # the checkout under test, when it is not the installed one (PYTHONPATH=$PWD pytest ...)
            **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ},
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_readme_fits_a_newcomers_first_hour():
    assert len(README.read_text().splitlines()) <= 300


def test_every_relative_link_in_readme_and_docs_resolves():
    broken = []
    for page in [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#", 1)[0]
            if path and "://" not in path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
