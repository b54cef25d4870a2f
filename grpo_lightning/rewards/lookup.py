"""A reward name in ``task.rewards`` -> the function: registered, a top-level callable of a reward
module, or an import path.

TRL users write plain functions in a file, and build some with factories
(``overlong = get_soft_overlong_punishment(...)``). A name is looked up, in this order of
precedence only to report clashes:

* ``pkg.module:function`` (or ``path/to/file.py:function``): that attribute, imported;
* a top-level callable of that name in the files / modules of ``task.reward_modules`` (and
  ``plugins``); only names listed in ``task.rewards`` are used, so a helper imported into the
  file is never picked up by accident;
* a function registered with ``@register_reward`` (the package's own, or a plug-in's).

Two different callables for one name are an error naming both places.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

from grpo_lightning.config.early_names import reward_not_found
from grpo_lightning.errors import ConfigError, PluginError
from grpo_lightning.registry import plugin_module
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS

MODULES_FIELD = "task.reward_modules"


def _entry_module(entry: str, field: str):
    try:
        return plugin_module(entry, field)
    except PluginError as err:
        raise ConfigError(str(err)) from None


def _by_path(name: str, field: str) -> Callable:
    where, _, attribute = name.rpartition(":")
    found = _entry_module(where, field)
    for part in attribute.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ConfigError(
                f"{field}: {where!r} has no attribute {attribute!r}; its callables: {callables_of(_entry_module(where, field))}"
            )
    return _checked_callable(found, name, f"{where}:{attribute}", field)


def _checked_callable(found, name: str, where: str, field: str) -> Callable:
    if inspect.isclass(found) or not callable(found):
        what = "a class" if inspect.isclass(found) else f"a {type(found).__name__}"
        raise ConfigError(
            f"{field}: {where} is {what}, not a reward function; name a function (or an instance with "
            f"__call__) that takes completions=... and returns one float per completion"
        )
    return found


def callables_of(module) -> list[str]:
    """The public top-level functions and callable objects of ``module`` (not classes or modules)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and callable(value) and not inspect.isclass(value) and not inspect.ismodule(value)
    )


def find_reward(name: str, modules: Sequence[str] = (), field: str | None = None) -> Callable:
    """The reward function ``name`` names (see the module docstring), or a ConfigError naming the fix."""
    field = field or "task.rewards"
    if ":" in name:
        return _by_path(name, field)
    found: dict[int, tuple[Callable, str]] = {}
    for entry in modules:
        module = _entry_module(entry, MODULES_FIELD)
        value = vars(module).get(name)
        if value is not None:
            found.setdefault(id(value), (_checked_callable(value, name, f"{entry}:{name}", field), entry))
    registered = REWARD_FUNCTIONS.get(name)
    if registered is not None:
        found.setdefault(id(registered), (registered, "the registered reward functions"))
    if len(found) > 1:
        places = " and ".join(where for _, where in found.values())
        raise ConfigError(
            f"{field}: {name!r} names different functions in {places}; rename one, or name it by path ('module:{name}')"
        )
    if found:
        return next(iter(found.values()))[0]
    raise ConfigError(not_found_message(name, modules, field))


def not_found_message(name: str, modules: Sequence[str], field: str) -> str:
    """No such reward: the closest name, the callables each module has, the registered names, the fix."""
    in_modules = {entry: callables_of(_entry_module(entry, MODULES_FIELD)) for entry in modules}
    return reward_not_found(name, field, REWARD_FUNCTIONS.names, in_modules)


def module_address(name: str, fn: Callable, modules: Sequence[str] = ()) -> tuple[str, str | None, str] | None:
    """(module, its file, attribute) where a worker process can import ``fn`` as the top-level
    ``name`` of a reward module (a factory's closure included); None when it is not one."""
    for entry in modules:
        module = _entry_module(entry, MODULES_FIELD)
        if vars(module).get(name) is fn:
            return module.__name__, getattr(module, "__file__", None), name
    return None


def reward_problem(name: str, modules: Sequence[str] = (), field: str | None = None) -> str | None:
    """None when ``name`` resolves, else the one-line problem."""
    try:
        find_reward(name, modules, field)
    except ConfigError as err:
        return str(err)
    return None
