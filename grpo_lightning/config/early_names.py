"""Registered names checked before torch is imported: a typo in ``algorithm.policy_loss``, ``task``,
``task.rewards`` or ``rollout.engine`` answers as fast as an unknown key.

The registries fill as modules that import torch load, so the early check (config/early.py) reads
the built-in names from registered_names.json, which ``python -m grpo_lightning.registered_index``
writes from the registries (a test fails when it is stale). A registry whose module is already
imported (a Python caller that registered its own entries) is read as well. Plug-in files are not
judged here: a command line naming them goes to the full path whole. The messages are the ones
the full path gives (registry.unknown_name_message, config.base.choice, :func:`reward_not_found`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from grpo_lightning.config.base import choice
from grpo_lightning.registry import closest, unknown_name_message

INDEX_FILE = Path(__file__).with_name("registered_names.json")
ALGORITHM_REGISTRIES = ("policy_loss", "advantage_estimator", "kl_estimator", "loss_agg")
ALGORITHM_CHOICES = ("advantage_scale", "is_level", "correction_mode", "truncated_sampling")


@cache
def _index() -> dict[str, dict]:
    return json.loads(INDEX_FILE.read_text())


def known_names(field: str) -> list[str]:
    """The built-in names of ``field``, plus what its live registry holds when already imported."""
    entry = _index()[field]
    names = list(entry["names"])
    module, _, attribute = entry["where"].partition(":")
    live = getattr(sys.modules.get(module), attribute, None)
    if live is not None:
        # vars(), not .entries: TASKS would import the tasks (and torch) on that first look
        held = live if isinstance(live, tuple) else vars(live).get("entries", vars(live).get("_entries", {}))
        names += [n for n in held if n not in names]
    return names


def name_problem(field: str, value: Any, shown_field: str | None = None) -> str | None:
    """None when ``value`` is a known name of ``field``, else the full path's one-line message."""
    names, shown = known_names(field), shown_field or field
    if value in names:
        return None
    kind = _index()[field]["kind"]
    if kind is None:
        problems: list[str] = []
        choice(problems, shown, value, names)
        return problems[0]
    return unknown_name_message(shown, value, names, kind)


def reward_not_found(name: str, field: str, registered: Sequence[str], in_modules: dict[str, list[str]]) -> str:
    """No such reward: the closest name, the callables each module has, the registered names, the fix."""
    hint = closest(name, [n for names in in_modules.values() for n in names] + list(registered))
    found = "".join(f" Callables in {entry}: {names}." for entry, names in in_modules.items())
    return (
        f"{field}={name!r} is not a registered reward function"
        + (" nor a top-level callable of task.reward_modules / plugins" if in_modules else "")
        + (f"; did you mean {hint!r}?" if hint else ".")
        + found
        + f" Registered: {sorted(registered)}. A plain function works once its file is in "
        "task.reward_modules=[my_rewards.py], or name it by import path ('pkg.module:function')"
    )


def reward_problem(name: str, field: str) -> str | None:
    """A reward name with no plug-in file in play: registered, or the message (import paths pass)."""
    names = known_names("task.rewards")
    if ":" in name or name in names:
        return None
    return reward_not_found(name, field, names, {})


def algorithm_name_problems(algorithm: Any, p: str = "algorithm.") -> tuple[list[str], bool]:
    """The registered-name problems of the algorithm group, in AlgorithmConfig.check_fields' order,
    and whether that is all its check would say on them (the rules on a valid correction list, its
    levels and options, need the registered classes)."""
    problems = [
        problem
        for field in (*ALGORITHM_REGISTRIES, *ALGORITHM_CHOICES)
        if (problem := name_problem(f"algorithm.{field}", getattr(algorithm, field), p + field)) is not None
    ]
    complete = True
    if name_problem("algorithm.policy_loss", algorithm.policy_loss) is None:
        bad = [
            problem
            for name in algorithm.corrections
            if (problem := name_problem("algorithm.corrections", name, f"{p}corrections")) is not None
        ]
        problems += bad
        complete = bool(bad) or (not algorithm.corrections and algorithm.is_level == "none")
    if (problem := name_problem("algorithm.lr_schedule", algorithm.lr_schedule, f"{p}lr_schedule")) is not None:
        problems.append(problem)
    return problems, complete
