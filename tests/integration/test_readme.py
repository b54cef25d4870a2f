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


@pytest.mark.slow
@pytest.mark.parametrize("doc", ["README.md", *RUNNABLE_DOCS])
def test_python_blocks_run_in_order_in_one_session(doc, tmp_path):
    """Every block of the page, in order, in one fresh interpreter as a reader's session would
    run them (one start-up per page, not per block); each block in a namespace and a folder of
    its own, so none leans on another's variables or files."""
    blocks = python_blocks(ROOT / doc)
    assert len(blocks) >= {"README.md": 3, "docs/python_api.md": 4}.get(doc, 1)
    run_blocks(doc, blocks, tmp_path)


RUNNER = """
import os, sys, traceback
import torch
torch.set_num_threads(1)
doc, blocks = sys.argv[1], sys.argv[2:]
for index, path in enumerate(blocks):
    folder = os.path.join(os.path.dirname(path), f"block_{index}")
    os.makedirs(folder)
    os.chdir(folder)
    source = open(path).read()
    try:
        exec(compile(source, f"{doc} python block {index}", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        sys.exit(f"{doc}: python block {index} failed (above)")
"""


def run_blocks(doc: str, blocks: list[str], tmp_path: Path) -> None:
    paths = []
    for index, block in enumerate(blocks):
        paths.append(tmp_path / f"block_{index}.py")
        paths[-1].write_text(block)
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, doc, *map(str, paths)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
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


def test_the_performance_page_stays_the_current_state():
    """docs/performance.md is the current state in at most 300 lines (issue 45): a feature's numbers
    live on its own page with one summary row there, older runs in benchmarks/results/LOG.md."""
    lines = len((ROOT / "docs" / "performance.md").read_text().splitlines())
    assert lines <= 300, f"docs/performance.md has {lines} lines: move details to the feature's page or the log"


LINKED_PAGES = [
    README,
    ROOT / "CONTRIBUTING.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks/results/LOG.md",
]


def test_every_relative_link_in_readme_and_docs_resolves():
    broken = []
    for page in LINKED_PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#", 1)[0]
            if path and "://" not in path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered."""
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_link_to_a_section_names_a_heading_of_that_page():
    """A section that moved or was renamed (docs/performance.md's log went to benchmarks/results/)
    must take its links with it."""
    broken = []
    for page in LINKED_PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if anchor and "://" not in path and linked.suffix == ".md" and linked.is_file():
                if anchor not in heading_anchors(linked):
                    broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
