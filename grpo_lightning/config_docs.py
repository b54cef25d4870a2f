"""docs/configuration.md, generated from the schema: one table per config group (key, type,
default, help), then each shipped task's own options, then the hand-written notes.

The schema is the one source of truth for every field's default and help, so the reference page
is written from it rather than by hand: ``python -m grpo_lightning.config_docs > docs/configuration.md``
(``tests/unit/test_config_docs.py`` fails when the page is stale). ``grpo-lightning help GROUP``
prints one group's table. The longer explanations that do not fit one line of help live in
``docs/configuration_notes.md``, appended as they are.

It imports the package (the tasks register their options on import), so it sits above the schema.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

import grpo_lightning  # noqa: F401  (registers the shipped tasks and rewards)
from grpo_lightning.config import TASKS, TaskConfig, TrainConfig
from grpo_lightning.config.nodes import PluginNodes

NOTES = Path(__file__).resolve().parent.parent / "docs" / "configuration_notes.md"
COMMAND = "python -m grpo_lightning.config_docs > docs/configuration.md"
HEADER = f"""# Configuration reference

<!-- Generated from the schema by `{COMMAND}`; do not edit by hand:
     change the field's help in grpo_lightning/config/*.py (or a task's options class), or
     docs/configuration_notes.md, and regenerate. tests/unit/test_config_docs.py checks it. -->

Every key below can be set on the command line (`grpo-lightning algorithm.beta=0`), in a YAML
option of your own, or in Python (`cfg.algorithm.beta = 0`). `grpo-lightning help GROUP` prints
one group's table; `grpo-lightning --cfg job` prints the resolved config of a run.
Longer explanations follow the tables ([Notes](#notes)).
"""


def _type_name(kind: Any) -> str:
    if kind is Any:
        return "any"
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(kind, "__name__", str(kind))


def _value(value: Any) -> str:
    """A default as one would write it in an override."""
    if value is None:
        return "null"
    if value == "":
        return '""'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(instance: Any, prefix: str, only: set[str] | None = None) -> tuple[list[str], list[tuple[str, Any]]]:
    """Table rows of ``instance``'s plain fields, and its nested groups (path, instance)."""
    rows, nested = [], []
    hints = typing.get_type_hints(type(instance))
    for f in dataclasses.fields(instance):
        if only is not None and f.name not in only:
            continue
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            nested.append((prefix + f.name, value))
            continue
        help_text = f.metadata.get("help", "")
        rows.append(
            f"| `{prefix}{f.name}` | {_cell(_type_name(hints[f.name]))} | `{_cell(_value(value))}` | {_cell(help_text)} |"
        )
    return rows, nested


def _tables(title: str, instance: Any, prefix: str, only: set[str] | None = None) -> list[str]:
    """The table of one group and, after it, one table per group nested in it."""
    rows, nested = _rows(instance, prefix, only)
    out = [f"## {title}" if "." not in title else f"### {title}", ""]
    if rows:
        out += ["| key | type | default | help |", "|---|---|---|---|", *rows, ""]
    for path, value in nested:
        out += _tables(path, value, path + ".")
        if isinstance(value, PluginNodes):  # a nested group's nodes (algorithm.teacher.<objective or kind>)
            for name, node in value.nodes().items():
                out += _tables(f"{path}.{name}", node, f"{path}.{name}.")
    return out


def _shipped_tasks() -> list[str]:
    """The tasks this package registers (a user's plug-in tasks are left out)."""
    return [
        name for name in TASKS.names if (TASKS.options(name) or TaskConfig).__module__.startswith("grpo_lightning.")
    ]


def group_names() -> list[str]:
    """What ``grpo-lightning help GROUP`` accepts: the top-level groups, ``top`` and ``task.<name>``."""
    groups = [
        f.name for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(getattr(TrainConfig(), f.name))
    ]
    return ["top", *groups, *(f"task.{name}" for name in _shipped_tasks())]


def group_table(group: str) -> str:
    """The Markdown of one group: ``top`` (keys outside every group), a group, or ``task.<name>``."""
    cfg = TrainConfig()
    if group == "top":
        top = {f.name for f in dataclasses.fields(cfg) if not dataclasses.is_dataclass(getattr(cfg, f.name))}
        return "\n".join(_tables("top level", cfg, "", only=top))
    if group == "task":
        return "\n".join(_tables("task", TaskConfig(), "task.")) + _task_choice()
    if group.startswith("task."):
        name = group.split(".", 1)[1]
        options = (TASKS.options(name) or TaskConfig)()
        own = {f.name for f in dataclasses.fields(options)} - {f.name for f in dataclasses.fields(TaskConfig)}
        lines = _tables(f"task={name}", options, "task.", only=own)
        lines[0] = f"### `task={name}`"
        shared = [
            f"`{k}: {_value(getattr(options, k))}`"
            for k in ("rewards", "correctness_reward")
            if getattr(options, k) != getattr(TaskConfig(), k)
        ]
        if shared:
            lines.append("Its defaults of the shared keys: " + ", ".join(shared) + ".\n")
        return "\n".join(lines)
    if group not in group_names():
        raise KeyError(f"no config group {group!r}; one of {group_names()}")
    instance = getattr(cfg, group)
    lines = _tables(group, instance, group + ".")
    if isinstance(
        instance, PluginNodes
    ):  # one node per registered entry with options (health.<check>, rewards.<source>)
        for name, node in instance.nodes().items():
            lines += _tables(f"{group}.{name}", node, f"{group}.{name}.")
    return "\n".join(lines)


def _task_choice() -> str:
    names = ", ".join(f"`{n}`" for n in _shipped_tasks())
    return (
        f"\nThe keys above are shared by every task; `task=<name>` ({names}) adds that task's own options, "
        "listed below (`grpo-lightning help task.<name>`).\n"
    )


def render() -> str:
    parts = [HEADER]
    groups = group_names()
    tasks = [g for g in groups if g.startswith("task.")]
    for group in groups:
        if not group.startswith("task."):
            parts += [group_table(group), *(group_table(t) for t in tasks if group == "task")]
    notes = NOTES.read_text() if NOTES.is_file() else ""
    body = "\n".join(p.rstrip("\n") + "\n" for p in parts)
    return body + ("\n# Notes\n\n" + notes.split("\n", 1)[1].lstrip("\n") if notes else "")


def cli_help(args: list[str]) -> int:
    """``grpo-lightning help [GROUP ...]``: each field of the groups with its one-line help."""
    if not args:
        print("usage: grpo-lightning help GROUP   (each key, its type, default and help)")
        print("groups: " + " ".join(group_names()))
        return 0
    unknown = [g for g in args if g not in group_names()]
    if unknown:
        print(f"error: no config group {unknown[0]!r}; one of: {' '.join(group_names())}", file=sys.stderr)
        return 2
    print("\n".join(group_table(g) for g in args))
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.write(group_table(args[0]) + "\n" if args else render())


if __name__ == "__main__":
    main()
