"""``task=reasoning_gym``: problems generated in code by PyPI ``reasoning-gym`` (no download).

Every record keeps the dataset's own entry, so the reward can call the dataset's
``score_answer`` on it: the task's definition of correct, not ours.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_lightning.data.files import DataError

INSTALL_HINT = "pip install 'reasoning-gym>=0.1.19'   (or: pip install -e '.[data]')"


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(f"task=reasoning_gym needs the package reasoning-gym: {INSTALL_HINT}") from err
    return reasoning_gym


# Our defaults per dataset, under task.dataset_options (which override them): each dataset
# gets its own, so the options of one never reach another (e.g. basic_arithmetic's
# `operators` made chain_sum and countdown fail). Datasets not listed use reasoning-gym's defaults.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
        "allow_negation": False, "allow_parentheses": False,
    },
}


def dataset_options(dataset: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Our defaults for ``dataset`` updated with ``options``; unknown names are an error listing the valid ones."""
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        raise DataError(f"task.dataset={dataset!r} is not a reasoning-gym dataset; choose one of {sorted(DATASETS)}")
    merged = {**DEFAULT_OPTIONS.get(dataset, {}), **(options or {})}
    valid = [f.name for f in dataclasses.fields(DATASETS[dataset][1]) if f.name not in ("seed", "size")]
    unknown = sorted(set(merged) - set(valid))
    if unknown:
        raise DataError(
            f"task.dataset_options {unknown} are not options of reasoning-gym's {dataset!r}; its options are {valid}"
        )
    return merged


def reasoning_gym_records(
    dataset: str, size: int, seed: int = 0, val_fraction: float = 0.2, options: dict[str, Any] | None = None
) -> tuple[list[dict], list[dict]]:
    """``size`` problems of ``dataset`` as records ``{"prompt", "answer", "entry"}``, split train / val."""
    rg = _reasoning_gym()
    options = dataset_options(dataset, options)
    try:
        data = rg.create_dataset(dataset, size=size, seed=seed, **options)
    except (KeyError, ValueError, AssertionError) as err:
        raise DataError(f"task.dataset={dataset!r} with task.dataset_options={options}: {err}") from err
    records = [
        {"prompt": entry["question"], "answer": str(entry["answer"]), "entry": _plain(entry)} for entry in data
    ]
    num_val = int(len(records) * val_fraction)
    return records[num_val:], records[:num_val]


def _plain(entry: dict) -> dict:
    """The entry with only what scoring needs (question, answer, metadata)."""
    return {"question": entry["question"], "answer": entry["answer"], "metadata": entry.get("metadata", {})}


def score_answer(answer: str | None, entry: dict) -> float:
    """The source dataset's ``score_answer``; a missing answer scores 0."""
    if answer is None:
        return 0.0
    fn = _reasoning_gym().get_score_answer_fn(entry["metadata"]["source_dataset"])
    return float(fn(answer, entry))
