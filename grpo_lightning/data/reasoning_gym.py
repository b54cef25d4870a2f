"""``task=reasoning_gym``: problems generated in code by PyPI ``reasoning-gym`` (no download).

Every record keeps the dataset's own entry, so the reward can call the dataset's
``score_answer`` on it: the task's definition of correct, not ours.
"""

from __future__ import annotations

from typing import Any

INSTALL_HINT = "pip install 'reasoning-gym>=0.1.19'   (or: pip install -e '.[data]')"


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(f"task=reasoning_gym needs the package reasoning-gym: {INSTALL_HINT}") from err
    return reasoning_gym


def reasoning_gym_records(
    dataset: str, size: int, seed: int = 0, val_fraction: float = 0.2, options: dict[str, Any] | None = None
) -> tuple[list[dict], list[dict]]:
    """``size`` problems of ``dataset`` as records ``{"prompt", "answer", "entry"}``, split train / val."""
    rg = _reasoning_gym()
    try:
        data = rg.create_dataset(dataset, size=size, seed=seed, **(options or {}))
    except (KeyError, ValueError) as err:
        raise ValueError(f"task.dataset={dataset!r} with task.dataset_options={options}: {err}") from err
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
