"""``task.reward_modules``: import the user's reward files or modules so their ``@register_reward``
functions can be named in ``task.rewards`` without editing the package."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

_IMPORTED: dict[str, object] = {}


def import_reward_modules(entries: list[str]) -> list[str]:
    """Import each entry (a ``.py`` path or a dotted module name) once; returns the problems found."""
    problems = []
    for entry in entries:
        if entry in _IMPORTED:
            continue
        try:
            _IMPORTED[entry] = _import(entry)
        except FileNotFoundError:
            problems.append(
                f"task.reward_modules: {entry!r} is neither a file nor an importable module; "
                f"give a path to a .py file or a dotted module name on PYTHONPATH"
            )
        except Exception as err:  # the user's code: show where it failed
            where = traceback.extract_tb(err.__traceback__)[-1]
            problems.append(
                f"task.reward_modules: importing {entry!r} raised {type(err).__name__}: {err} "
                f"(at {where.filename}:{where.lineno})"
            )
    return problems


def _import(entry: str):
    path = Path(entry).expanduser()
    if entry.endswith(".py") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(entry)
        name = f"grpo_lightning_user_rewards.{path.stem}_{abs(hash(str(path.resolve()))):x}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(entry)
    except ModuleNotFoundError as err:
        if err.name and entry.startswith(err.name):
            raise FileNotFoundError(entry) from err
        raise
