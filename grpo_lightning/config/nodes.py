"""Config nodes built from registries: a registered entry's own options dataclass becomes the
node named by the entry (``algorithm.sapo.tau_pos``, ``health.diversity.action``).

A group that takes such nodes subclasses :class:`PluginNodes` and names its registries in
``node_registries``. Why two forms of the same nodes:

- In Python a node appears on first access (``TrainConfig().health.diversity``), so a config
  made before a plug-in file was imported still reaches the plug-in's options.
- Hydra composes onto declared dataclass fields only, so :func:`with_plugin_nodes` builds a
  subclass with one real field per node. Composition runs it after phase 1 has imported the
  plug-ins, so the registries are full by then.

``builtin_modules`` names the package modules whose import registers the group's built-in
entries (``grpo_lightning.health``): they are loaded by name through the plug-in mechanism,
exactly as a user's file is, so the schema layer imports nothing above it.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import field, fields, is_dataclass, make_dataclass
from typing import Any, ClassVar

from grpo_lightning.config.base import Schema
from grpo_lightning.errors import PluginError
from grpo_lightning.registry import Registry, load_plugins


class PluginNodes(Schema):
    """A config group with one node per registered entry that declares options."""

    # A Registry, or "module:NAME" for one defined in a module imported only when the nodes are
    # needed (the algorithm registries live beside torch code: the CLI's first checks skip them).
    node_registries: ClassVar[tuple[Registry | str, ...]] = ()
    builtin_modules: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def registries(cls) -> list[Registry]:
        found = []
        for entry in cls.node_registries:
            if isinstance(entry, str):
                module, _, name = entry.partition(":")
                entry = getattr(importlib.import_module(module), name)
            found.append(entry)
        return found

    @classmethod
    def node_options(cls) -> dict[str, type]:
        """Node name -> options dataclass, for every registered entry that declares options."""
        load_plugins(cls.builtin_modules)
        nodes: dict[str, type] = {}
        for registry in cls.registries():
            for name in registry:
                options = registry.options(name)
                if options is None:
                    continue
                if name in nodes or name in getattr(cls, "__dataclass_fields__", {}) and not _is_node(cls, name):
                    raise PluginError(
                        f"the {registry.kind} {name!r} declares options, but {registry.config_field.rpartition('.')[0]}"
                        f".{name} is already a config field; register it under another name"
                    )
                nodes[name] = options
        return nodes

    def __getattr__(self, name: str) -> Any:
        # Only reached when ``name`` is not a field: a registered entry's node, made on first use.
        if not name.startswith("_"):
            options = type(self).node_options().get(name)
            if options is not None:
                node = options()
                object.__setattr__(self, name, node)
                return node
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in getattr(type(self), "__dataclass_fields__", {}) and name in type(self).node_options():
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def nodes(self) -> dict[str, Any]:
        """Every registered node of this group, by name (made with its defaults if not yet set)."""
        return {name: getattr(self, name) for name in type(self).node_options()}

    def _nodes_to_check(self) -> dict[str, Any]:
        """The nodes the dataclass walk of :class:`Schema` misses: made on access, or plain dataclasses."""
        own = {f.name for f in fields(self)}
        return {n: node for n, node in self.nodes().items() if n not in own or not isinstance(node, Schema)}

    def type_problems(self, prefix: str = "") -> list[str]:
        problems = super().type_problems(prefix)
        for name, node in self._nodes_to_check().items():
            problems += Schema.type_problems(node, f"{prefix}{name}.")  # any dataclass: its typed fields
        return problems

    def rule_problems(self, prefix: str = "") -> list[str]:
        problems = []
        for name, node in self._nodes_to_check().items():
            if isinstance(node, Schema):
                problems += node.rule_problems(f"{prefix}{name}.")
            elif hasattr(node, "check_fields"):  # a plain options dataclass may check itself like a Schema
                problems += node.check_fields(f"{prefix}{name}.")
        return problems + super().rule_problems(prefix)


def _is_node(cls: type, name: str) -> bool:
    return bool(cls.__dataclass_fields__[name].metadata.get("plugin_node"))


def _node_help(name: str, options: type) -> str:
    doc = (options.__doc__ or "").strip().splitlines()
    summary = doc[0] if doc and not doc[0].startswith(options.__name__ + "(") else ""
    return (f"Options of {name}: {summary}" if summary else f"Options of {name}.")[:150]


def _plain(value: Any) -> Any:
    """A config as nested dicts, every node included, whichever form (built or made on access) holds it."""
    if is_dataclass(value) and not isinstance(value, type):
        plain = {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
        if isinstance(value, PluginNodes):
            plain.update({name: _plain(node) for name, node in value.nodes().items()})
        return plain
    return value


def _same_config(self: Any, other: Any) -> bool:
    """A built config equals a plain one with the same values (``compose(...)[0] == TrainConfig()``)."""
    if not isinstance(other, type(self).__mro__[1]) and not isinstance(self, type(other)):
        return NotImplemented
    return _plain(self) == _plain(other)


_BUILT: dict[tuple, type] = {}


def with_plugin_nodes(cls: type) -> type:
    """``cls`` with one real field per registry node, in every nested group that takes them
    (``cls`` itself when there are none); built once per set of nodes."""
    hints = typing.get_type_hints(cls)
    extra = []
    if issubclass(cls, PluginNodes):
        own = {f.name for f in fields(cls)}
        extra += [
            (
                name,
                options,
                field(default_factory=options, metadata={"help": _node_help(name, options), "plugin_node": 1}),
            )
            for name, options in cls.node_options().items()
            if name not in own
        ]
    for f in fields(cls):
        kind = hints[f.name]
        if is_dataclass(kind) and (built := with_plugin_nodes(kind)) is not kind:
            extra.append((f.name, built, dataclasses.field(default_factory=built, metadata=f.metadata)))
    if not extra:
        return cls
    key = (cls, tuple((name, kind) for name, kind, _ in extra))
    if key not in _BUILT:
        namespace = {"__module__": cls.__module__, "__eq__": _same_config}
        _BUILT[key] = make_dataclass(cls.__name__, extra, bases=(cls,), namespace=namespace, eq=False)
    return _BUILT[key]
