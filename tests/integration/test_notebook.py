"""notebooks/quickstart.ipynb runs top to bottom on the tiny model in under two minutes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def outputs(cell) -> tuple[str, set[str]]:
    text = "".join(o.get("text", "") for o in cell.outputs)
    kinds = {kind for o in cell.outputs for kind in o.get("data", {})}
    html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
    return text + html, kinds


def test_quickstart_notebook_executes_and_shows_curves_and_completions(tmp_path, monkeypatch):
    # The kernel must be this interpreter (the one with grpo_lightning installed).
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert 'MODEL = "tiny"' in nb.cells[1].source  # the parameter that switches to SmolLM2
    start = time.perf_counter()
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    seconds = time.perf_counter() - start
    print(f"notebook ran in {seconds:.1f} s")

    code = [c for c in nb.cells if c.cell_type == "code"]
    everything = [outputs(c) for c in code]
    accuracy_line = next(t for t, _ in everything if "held-out accuracy" in t)
    before, after = (
        float(x) for x in accuracy_line.split("held-out accuracy: ")[1].split(" after")[0].split(" before -> ")
    )
    assert after > before, accuracy_line
    assert any("image/png" in kinds for _, kinds in everything), "no plot was drawn"
    table = next(t for t, _ in everything if "<th>advantage</th>" in t)
    assert "<th>reward/arithmetic_exact</th>" in table and table.count("<tr>") == 1 + 16
    assert "answer" in everything[-1][0]


VISION = NOTEBOOK.parent / "vision.ipynb"


def test_vision_notebook_trains_and_shows_pictures_with_completions(tmp_path, monkeypatch):
    """notebooks/vision.ipynb with a plain Trainer, cut to 2 steps and 8 held-out questions (its 300 steps
    take minutes, more than this suite's share; docs/vision.md has what the tiny VLM learns): held-out
    accuracy before and after, the curves, the last step's pictures with their completions, and the
    prompt's image hashes."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    nb = nbformat.read(VISION, as_version=4)
    assert '"color", "shape", "count", "side"]' in nb.cells[1].source and "STEPS = 300" in nb.cells[1].source
    nb.cells[1].source = nb.cells[1].source.replace("STEPS = 300", "STEPS = 2")
    assert "cfg.eval.num_prompts = 200" in nb.cells[2].source
    nb.cells[2].source = nb.cells[2].source.replace("cfg.eval.num_prompts = 200", "cfg.eval.num_prompts = 8")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    everything = [outputs(c) for c in nb.cells if c.cell_type == "code"]
    line = next(t for t, _ in everything if "held-out accuracy" in t)
    before, after = (float(x) for x in line.split("held-out accuracy: ")[1].split(" after")[0].split(" before -> "))
    assert 0 <= before <= 1 and 0 <= after <= 1 and "after 2 steps" in line, line
    assert all(f"'{t}': " in line for t in ("color", "shape", "count", "side")), line  # each type's held-out accuracy
    assert sum("image/png" in kinds for _, kinds in everything) == 2, "no curve or no pictures"
    assert "<image:" in everything[-1][0] and "images: ['sha:" in everything[-1][0]
