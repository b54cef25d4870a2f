"""What every config dataclass shares: fields with help text, typo-proof attributes, own validation.

This module imports nothing from the package above :mod:`grpo_lightning.registry` and
:mod:`grpo_lightning.errors`: the schema is the lowest layer.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from dataclasses import field, fields, is_dataclass
from typing import Any

from grpo_lightning.config.trl_names import trl_hint
from grpo_lightning.errors import ConfigError


class UnknownFieldError(ConfigError, AttributeError):
    """An attribute or key that no config dataclass declares (a typo); names the closest field."""


def option(default: Any, help: str) -> Any:
    """A dataclass field with one line of help text (``metadata={"help": ...}``)."""
    if isinstance(default, (dict, list)) or is_dataclass(default):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _initials(name: str) -> str:
    return "".join(word[0] for word in name.split("_") if word)


def closest_key(name: str, choices: list[str]) -> str | None:
    """The choice most like ``name``: by spelling (difflib), by the same last part, or by initials
    (``learning_rate`` -> ``lr``); None when nothing is close."""
    found = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if found:
        return found[0]
    leaf = name.rsplit(".", 1)[-1]
    parent = name.rsplit(".", 1)[0] if "." in name else ""
    same_leaf = [c for c in choices if c.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return same_leaf[0]
    siblings = [c for c in choices if (c.rsplit(".", 1)[0] if "." in c else "") == parent]
    for c in siblings:
        other = c.rsplit(".", 1)[-1]
        if other == _initials(leaf) or leaf == _initials(other):
            return c
    found = difflib.get_close_matches(leaf, [c.rsplit(".", 1)[-1] for c in siblings], n=1, cutoff=0.5)
    return f"{parent}.{found[0]}" if parent and found else (found[0] if found else None)


def unknown_key_message(key: str, choices: list[str]) -> str:
    trl = trl_hint(key) if "." not in key else None
    if trl is not None:
        return f"{key} is not a config field; did you mean {trl[0]}? ({trl[1]} is TRL's name)"
    hint = closest_key(key, choices)
    return f"{key} is not a config field" + (f"; did you mean {hint}?" if hint else "")


def schema_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted field path of a config dataclass, nested groups included."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        keys.append(prefix + f.name)
        kind = hints[f.name]
        if is_dataclass(kind):
            keys += schema_keys(kind, f"{prefix}{f.name}.")
    return keys


def choice(problems: list[str], name: str, value: Any, allowed: tuple | list) -> None:
    """Append the message for ``value`` outside ``allowed`` (all of them listed)."""
    if value not in allowed:
        problems.append(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")


def check(problems: list[str], ok: bool, message: str) -> None:
    if not ok:
        problems.append(message)


def _type_problem(name: str, value: Any, kind: Any) -> str | None:
    """``value`` against a field annotation of int / float / bool / str (Optional allowed)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union and type(None) in args:
        if value is None:
            return None
        kind = next(a for a in args if a is not type(None))
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is bool:
        ok = isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    else:
        return None
    if ok:
        return None
    article = "an" if kind is int else "a"
    return f"{name}={value!r} must be {article} {kind.__name__}, not {type(value).__name__}"


class Schema:
    """Base of every config dataclass.

    Setting an attribute no field declares raises :class:`UnknownFieldError` naming the closest
    field (``cfg.algorithm.learning_rate = 1e-6`` is a typo of ``lr``, not a new setting);
    :meth:`validate` checks the fields' types and then :meth:`check_fields`, the subclass's
    own rules, written right below its fields.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        known = getattr(type(self), "__dataclass_fields__", None)
        if known is not None and name not in known and not name.startswith("_"):
            hint = closest_key(name, list(known))
            trl = trl_hint(name) if type(self).__name__ == "TrainConfig" else None
            hint = f"cfg.{trl[0]} ({trl[1]} is TRL's name)" if trl else (repr(hint) if hint else None)
            raise UnknownFieldError(
                f"{type(self).__name__} has no field {name!r}"
                + (f"; did you mean {hint}?" if hint else "")
                + f" Fields: {sorted(known)}"
            )
        object.__setattr__(self, name, value)

    def check_fields(self, prefix: str) -> list[str]:
        """This group's own rules; ``prefix`` is its dotted path (``algorithm.``)."""
        return []

    def validate(self, prefix: str = "") -> list[str]:
        """Every problem of this group and of the groups nested in it, each naming its field.

        Types first: the rules compare numbers, so they run only on well-typed fields."""
        return self.type_problems(prefix) or self.rule_problems(prefix)

    def type_problems(self, prefix: str = "") -> list[str]:
        problems = []
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Schema):
                problems += value.type_problems(f"{prefix}{f.name}.")
            elif (problem := _type_problem(prefix + f.name, value, hints[f.name])) is not None:
                problems.append(problem)
        return problems

    def rule_problems(self, prefix: str = "") -> list[str]:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Schema):
                problems += value.rule_problems(f"{prefix}{f.name}.")
        return problems + self.check_fields(prefix)


def field_help(config_cls: type) -> dict[str, str]:
    """Field name -> help text of a config dataclass (used by tests and docs)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(config_cls)}
