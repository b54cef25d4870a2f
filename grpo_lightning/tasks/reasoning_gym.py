"""``task=reasoning_gym``: problems generated in code by PyPI ``reasoning-gym`` (no download).

Every record keeps the dataset's own entry, so the ``reasoning_gym`` reward can call the
dataset's ``score_answer`` on it: the task's definition of correct, not ours.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass
from typing import Any

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.errors import DataError
from grpo_lightning.rewards.answers import extract_answer
from grpo_lightning.rewards.math_answers import math_equal, plain_number
from grpo_lightning.rewards.registry import register_reward
from grpo_lightning.tasks.base import Check, checked, split

INSTALL_HINT = "pip install 'reasoning-gym>=0.1.19'   (or: pip install -e '.[data]')"


def _reasoning_gym():
    try:
        import reasoning_gym  # noqa: PLC0415  (reasoning-gym: optional, the data extra)
    except ImportError as err:
        raise ImportError(f"task=reasoning_gym needs the package reasoning-gym: {INSTALL_HINT}") from err
    return reasoning_gym


# Our defaults per dataset, under task.dataset_options (which override them): each dataset
# gets its own, so the options of one never reach another (e.g. basic_arithmetic's
# `operators` made chain_sum and countdown fail). Datasets not listed use reasoning-gym's defaults.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ["+", "-"],
        "allow_negation": False,
        "allow_parentheses": False,
    },
}


@dataclass
class ReasoningGymTaskConfig(TaskConfig):
    name: str = task_name("reasoning_gym")
    dataset: str = option("basic_arithmetic", "The reasoning-gym dataset name (e.g. basic_arithmetic, chain_sum).")
    dataset_options: dict[str, Any] = option(
        {}, "Keyword arguments of the dataset's config, on top of DEFAULT_OPTIONS and its own defaults."
    )
    size: int = option(1000, "Problems generated (train + validation).")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.size >= 1, f"{p}size={self.size} must be >= 1")
        return problems


def dataset_options(dataset: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Our defaults for ``dataset`` updated with ``options``; unknown names are an error listing the valid ones."""
    from reasoning_gym.factory import DATASETS  # noqa: PLC0415  (reasoning-gym: optional, the data extra)

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
    records = [{"prompt": entry["question"], "answer": str(entry["answer"]), "entry": _plain(entry)} for entry in data]
    return split(records, val_fraction)


@TASKS.register("reasoning_gym", options=ReasoningGymTaskConfig)
def reasoning_gym(options: ReasoningGymTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    train, val = reasoning_gym_records(
        options.dataset, options.size, options.seed, options.val_fraction, options.dataset_options
    )
    return checked(options.name, train, val, check)


def _plain(entry: dict) -> dict:
    """The entry with only what scoring needs (question, answer, metadata)."""
    return {"question": entry["question"], "answer": entry["answer"], "metadata": entry.get("metadata", {})}


_SCORER_FAILURES_WARNED: set[str] = set()  # datasets whose scorer raised once already


def score_answer(answer: str | None, entry: dict) -> float:
    """The source dataset's ``score_answer``; a missing answer scores 0.

    Some datasets' scorers raise on an answer they cannot parse (prime_factorization:
    ``int("16,")``). A malformed answer is a wrong one: it scores 0 and the run goes on,
    with one warning per dataset naming the answer and the error.
    """
    if answer is None:
        return 0.0
    dataset = entry["metadata"]["source_dataset"]
    fn = _reasoning_gym().get_score_answer_fn(dataset)
    try:
        return float(fn(answer, entry))
    except Exception as err:  # the dataset's own code, on the policy's text
        if dataset not in _SCORER_FAILURES_WARNED:
            _SCORER_FAILURES_WARNED.add(dataset)
            warnings.warn(
                f"reasoning-gym's {dataset} score_answer raised {type(err).__name__}: {err} on the answer "
                f"{answer[:80]!r}; such answers score 0 (a malformed answer is a wrong one). "
                f"Further failures of {dataset}'s scorer score 0 without a warning.",
                stacklevel=2,
            )
        return 0.0


@register_reward("reasoning_gym")
def reasoning_gym_correct(prompts: list[str], completions: list[str], entry: list[dict], **_) -> list[float]:
    """The dataset's own ``score_answer(extracted answer, entry)`` (1.0 for correct, partial credit where it
    gives any); a numeric reference also accepts an equivalent form (math-verify: ``0.5`` for ``1/2``)."""
    scores = []
    for completion, e in zip(completions, entry, strict=True):
        guess = extract_answer(completion)
        score = score_answer(guess, e)
        if score < 1.0 and is_numeric(str(e["answer"])) and math_equal(guess, str(e["answer"])):
            score = 1.0
        scores.append(score)
    return scores


def is_numeric(answer: str) -> bool:
    """A number or a fraction of two ("12", "-3.5", "3/4"): the answers math-verify may compare."""
    return plain_number(answer) is not None or re.fullmatch(r"\s*-?\d+\s*/\s*\d+\s*", answer) is not None
