"""The one plug-in mechanism: named entries of one kind, each with optional options.

Every extension point (policy losses, advantage estimators, KL estimators, loss aggregations,
rewards, tasks, rollout engines, weight-sync transports, health checks, ...) is a
:class:`Registry`. Adding a variant is one new file with one decorated definition::

    from grpo_lightning.algorithm.policy_loss import POLICY_LOSSES

    @POLICY_LOSSES.register("my_loss", options=MyLossOptions)
    def my_loss(...): ...

An unknown name fails at config time with the registered names and the closest match.
A user's own file registers into any registry through ``plugins=[my_stuff.py]``
(:func:`load_plugins`); nothing in the package is edited.

This module imports nothing from the package but :mod:`grpo_lightning.errors`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from grpo_lightning.errors import ConfigError, PluginError

T = TypeVar("T")


def closest(name: str, choices: list[str] | tuple[str, ...]) -> str | None:
    """The choice most like ``name`` (difflib), or None when nothing is close."""
    found = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return found[0] if found else None


def unknown_name_message(field: str, name: object, choices: list[str] | tuple[str, ...], kind: str) -> str:
    """One line: the field, the bad value, the closest real choice, every choice."""
    hint = closest(str(name), choices)
    did_you_mean = f"; did you mean {hint!r}?" if hint else "."
    return f"{field}={name!r} is not a registered {kind}{did_you_mean} Registered: {sorted(choices)}"


class Registry(Generic[T]):
    """Entries of one kind by name, in registration order, each with an optional options dataclass.

    ``kind`` names an entry in messages ("policy loss"); ``config_field`` is the config key that
    selects one ("algorithm.policy_loss").
    """

    def __init__(self, kind: str, config_field: str):
        self.kind = kind
        self.config_field = config_field
        self.entries: dict[str, T] = {}
        self._options: dict[str, type | None] = {}
        self._origins: dict[str, str] = {}

    def add(self, name: str, entry: T, *, options: type | None = None) -> T:
        """Register ``entry`` under ``name``; a second, different entry with that name is an error."""
        if name in self.entries and self.entries[name] is not entry:
            raise PluginError(f"a {self.kind} named {name!r} is already registered; pick another name")
        if name not in self.entries:
            self._origins[name] = _registering_module()
        self.entries[name] = entry
        self._options[name] = options
        return entry

    def register(self, name: str, *, options: type | None = None) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def decorator(entry: T) -> T:
            return self.add(name, entry, options=options)

        return decorator

    def options(self, name: str) -> type | None:
        """The options dataclass ``name`` declared, or None."""
        self[name]  # raises for an unknown name
        return self._options[name]

    def origin(self, name: str) -> str:
        """The module that registered ``name``: an instance of a package class registered by a
        plug-in (a reward model source) belongs to the plug-in, whatever its ``__module__`` says."""
        self[name]  # raises for an unknown name
        return self._origins[name]

    def problem(self, name: object, field: str | None = None) -> str | None:
        """None when ``name`` is registered, else the one-line message naming the closest match."""
        if name in self.entries:
            return None
        return unknown_name_message(field or self.config_field, name, self.names, self.kind)

    def __getitem__(self, name: str) -> T:
        if name not in self.entries:
            raise ConfigError(self.problem(name))
        return self.entries[name]

    def get(self, name: str, default: Any = None) -> T | Any:
        return self.entries.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def items(self):
        return self.entries.items()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self.entries)})"


def _registering_module() -> str:
    """The module a registration came from: the first frame up the stack that runs a module's
    top level or lies outside the package. The package's helpers (``register_reward``, the
    Python API's function registration) pass through to their caller, so a plug-in or a test
    that registers through them is theirs, not the package's."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "?")
        own = module == __name__ or (module.startswith("grpo_lightning.") and frame.f_code.co_name != "<module>")
        if not own:
            return module
        frame = frame.f_back
    return "?"


_LOADED: dict[str, object] = {}


def load_plugins(entries: list[str] | tuple[str, ...], field: str = "plugins") -> None:
    """Import each entry (a ``.py`` path or a dotted module name) once, so what it registers exists.

    Raises :class:`PluginError` naming the entry (and, for an error inside it, the file and line).
    """
    problems = []
    for entry in entries:
        if entry in _LOADED:
            continue
        try:
            _LOADED[entry] = _import(entry)
        except FileNotFoundError:
            problems.append(
                f"{field}: {entry!r} is neither a file nor an importable module; "
                "give a path to a .py file or a dotted module name on PYTHONPATH"
            )
        except Exception as err:  # noqa: BLE001  (the user's code: say where it failed)
            where = _last_frame(err)
            problems.append(f"{field}: importing {entry!r} raised {type(err).__name__}: {err}{where}")
    if problems:
        raise PluginError("\n".join(problems))


def plugin_module(entry: str, field: str = "plugins"):
    """The module ``entry`` (a ``.py`` path or a dotted name) names, imported once as :func:`load_plugins` does."""
    load_plugins([entry], field)
    return _LOADED[entry]


def _last_frame(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _import(entry: str):
    path = Path(entry).expanduser()
    if entry.endswith(".py") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(entry)
        name = f"grpo_lightning_plugins.{path.stem}_{abs(hash(str(path.resolve()))):x}"
        if name in sys.modules:  # the same file under another spelling (relative, absolute, ~): imported once
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    try:
        return importlib.import_module(entry)
    except ModuleNotFoundError as err:
        if err.name and entry.startswith(err.name):
            raise FileNotFoundError(entry) from err
        raise
