"""The prompts the TRL-style reward tests train on: sums, with a ``solution`` column."""

from __future__ import annotations

import json
from pathlib import Path


def write_sums(folder: Path) -> Path:
    pairs = [(3, 4), (1, 2), (5, 6), (2, 9), (7, 1), (4, 4)]
    rows = [{"prompt": f"{a}+{b}=", "question": f"{a}+{b}=", "solution": str(a + b)} for a, b in pairs]
    path = folder / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
