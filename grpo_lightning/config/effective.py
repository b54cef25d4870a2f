"""The effective config: the chosen model's defaults applied, and what differs from the defaults.

A model brings defaults of other groups (``MODEL_DEFAULTS`` in config/model.py: SmolLM2's lr is
not the tiny model's), and a task may bring its own per model (``task.model_defaults``: a turn
budget and a batch that fit the tiny model's alphabet and context, or a CPU's minutes with
SmolLM2). :func:`apply_model_defaults` puts them in place of a group default the
user did not set: a key named on the command line (``explicit``) or holding a value other than
the schema's default (set by a preset, a group option or in Python) keeps its value. It runs
once per config (the CLI's composition, else ``build_run``); :func:`differences` is what the run
prints at its start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from grpo_lightning.config.model import model_defaults
from grpo_lightning.errors import ConfigError

_APPLIED = "_model_defaults_applied"  # set on a config once its model's defaults are in place


def _get(node: Any, key: str) -> Any:
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _set(node: Any, key: str, value: Any) -> None:
    head, _, leaf = key.rpartition(".")
    setattr(_get(node, head) if head else node, leaf, value)


def brought(cfg: Any) -> dict[str, Any]:
    """The defaults the chosen model brings, then those the task brings for that model (``task.model_defaults``:
    a task's turn budget and batch for the tiny model differ from SmolLM2's), the task's first."""
    name = cfg.model.name_or_path
    return {**model_defaults(name), **dict(getattr(cfg.task, "model_defaults", {}).get(name, {}))}


def apply_model_defaults(cfg: Any, explicit: Iterable[str] = ()) -> dict[str, Any]:
    """Put ``cfg.model``'s defaults in place (once) and return those applied (key -> value)."""
    if getattr(cfg, _APPLIED, False):
        return {}
    defaults, explicit, applied = type(cfg)(task=type(cfg.task)()), set(explicit), {}
    for key, value in brought(cfg).items():
        try:
            current, default = _get(cfg, key), _get(defaults, key)
        except AttributeError:
            raise ConfigError(
                f"task.model_defaults for {cfg.model.name_or_path} names {key}, which is not a config field"
            ) from None
        if key not in explicit and current == default:
            _set(cfg, key, value)
            applied[key] = value
    object.__setattr__(cfg, _APPLIED, True)
    return applied


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            out.update(_flat(getattr(value, f.name), f"{prefix}{f.name}."))
        return out
    return {prefix.rstrip("."): value}


def differences(cfg: Any) -> list[str]:
    """``key=value`` for every effective value that differs from the schema's default (the chosen
    task's own defaults for ``task.*``), those the model brought marked as such."""
    ours = _flat(cfg)
    base = _flat(type(cfg)(task=type(cfg.task)()))
    model, tasks = model_defaults(cfg.model.name_or_path), brought(cfg)
    lines = []
    for key, value in ours.items():
        if key in base and base[key] != value:
            note = ""
            if key in tasks and tasks[key] == value:
                whose = "" if key in model and model[key] == value else f"task={cfg.task.name}'s default for "
                note = f"  ({whose}{cfg.model.name_or_path})" if whose else f"  ({cfg.model.name_or_path}'s default)"
            shown = repr(value)
            lines.append(f"{key}={shown if len(shown) <= 48 else shown[:45] + '...'}{note}")
    return lines
