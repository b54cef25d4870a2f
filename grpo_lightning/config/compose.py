"""Two-phase composition of the Hydra config groups (``grpo_lightning/conf``) onto :class:`TrainConfig`.

Phase 1 reads ``plugins=[...]`` (and the deprecated ``task.reward_modules=[...]``) from the
overrides and imports them, so whatever they register exists, and stores the schema with a
node for each registered entry's options (:func:`store_schema`). Phase 2 composes every group onto
the schema, then refuses any key the schema does not declare, ``+`` or not (Hydra's ``+`` adds
keys silently), naming the closest real one. ``task.rewards={...}`` (any dict-typed field)
assigns: the override is held back from Hydra, which would merge it key-wise, and applied after.

The CLI (``grpo_lightning.train``) runs phase 1 on ``sys.argv`` before ``@hydra.main`` and
:func:`finish` on what Hydra composed; :func:`compose` does both for Python and tests.
"""

from __future__ import annotations

import typing
import warnings
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from grpo_lightning.config.base import schema_keys, unknown_key_message
from grpo_lightning.config.nodes import with_plugin_nodes
from grpo_lightning.config.task import TaskConfig
from grpo_lightning.config.train import TrainConfig
from grpo_lightning.errors import ConfigError
from grpo_lightning.registry import load_plugins

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

# The schema Hydra composes onto: the dataclass defaults, except that task.rewards is empty and
# every conf/task/*.yaml names its own rewards. Hydra merges dicts key-wise and a config file
# cannot replace or delete one (Hydra issue #1896): a task file's rewards merged onto the
# arithmetic default would keep the arithmetic rewards too. TaskConfig keeps the arithmetic rewards
# as its default because TrainConfig() in Python is the arithmetic task and must run as it is, so
# conf/task/arithmetic.yaml names the same rewards (tests/test_config.py checks they agree).
SCHEMA = TrainConfig(task=TaskConfig(rewards={}))
ConfigStore.instance().store(name="train_schema", node=SCHEMA)

REWARD_MODULES_DEPRECATED = "task.reward_modules is deprecated: use plugins=[...] (it is merged into plugins)"


def _dict_fields(cls: type, prefix: str = "") -> set[str]:
    """Dotted paths of the dict-typed fields (task.rewards, task.dataset_options)."""
    found = set()
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        kind = hints[f.name]
        if is_dataclass(kind):
            found |= _dict_fields(kind, f"{prefix}{f.name}.")
        elif typing.get_origin(kind) is dict:
            found.add(prefix + f.name)
    return found


DICT_FIELDS = _dict_fields(TrainConfig)


@dataclass
class Plan:
    """Phase 1's result: the overrides Hydra composes, and those applied after it (in order)."""

    hydra: list[str] = field(default_factory=list)
    deferred: list[Override] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)


def _parse(text: str) -> Override | None:
    if text.startswith("-") or ("=" not in text and not text.startswith("~")):
        return None  # a Hydra flag (--cfg job, -m) or its argument
    try:
        return OverridesParser.create().parse_override(text)
    except HydraException:
        return None  # Hydra reports it


def plan(overrides: list[str] | tuple[str, ...], load: bool = True) -> Plan:
    """Phase 1: import ``plugins`` / ``task.reward_modules`` and hold back dict assignments."""
    result, held = Plan(), set()
    for text in overrides:
        o = _parse(text)
        if o is None:
            result.hydra.append(text)
            continue
        key = o.key_or_group
        whole_dict = o.type == OverrideType.CHANGE and key in DICT_FIELDS and not o.is_sweep_override()
        if whole_dict and isinstance(o.value(), dict):
            held.add(key)
        if any(key == k or key.startswith(k + ".") for k in held):
            result.deferred.append(o)
            continue
        result.hydra.append(text)
        if key in ("plugins", "task.reward_modules") and o.type != OverrideType.DEL and not o.is_sweep_override():
            entries = o.value()
            entries = [entries] if isinstance(entries, str) else list(entries or [])
            if load:
                load_plugins(entries, field=key)
            result.plugins += entries
    store_schema()
    return result


def store_schema() -> type[TrainConfig]:
    """Store the schema with a node per registered entry's options (``algorithm.sapo``,
    ``health.<check>``; config/nodes.py) for Hydra; run after the plug-ins are imported."""
    schema = with_plugin_nodes(TrainConfig)
    ConfigStore.instance().store(name="train_schema", node=schema(task=TaskConfig(rewards={})))
    return schema


def _apply(cfg: DictConfig, o: Override) -> None:
    key = o.key_or_group
    with open_dict(cfg):
        if o.type == OverrideType.DEL:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent)
            if node is None or leaf not in node:
                raise ConfigError(f"~{key}: there is no {key} to delete")
            del node[leaf]
        elif key in DICT_FIELDS:  # assign, do not merge
            OmegaConf.update(cfg, key, o.value(), merge=False)
        else:
            OmegaConf.update(cfg, key, o.value(), merge=True)


def unknown_keys(node: Any, cls: type, prefix: str = "") -> list[str]:
    """Keys of a composed config that the schema ``cls`` does not declare (dict fields are open)."""
    hints = typing.get_type_hints(cls)
    found = []
    for key in node:
        if key not in hints:
            found.append(f"{prefix}{key}")
        elif is_dataclass(hints[key]) and isinstance(node[key], DictConfig):
            found += unknown_keys(node[key], hints[key], f"{prefix}{key}.")
    return found


def finish(cfg: DictConfig, deferred: list[Override] = ()) -> TrainConfig:
    """Phase 2's end: apply held-back overrides, refuse unknown keys, return the typed config.

    ``cfg`` is changed in place (it is what the logger records)."""
    try:
        for o in deferred:
            _apply(cfg, o)
    except OmegaConfBaseException as err:
        raise ConfigError(f"invalid override: {err}") from None
    schema = with_plugin_nodes(TrainConfig)
    unknown = unknown_keys(cfg, schema)
    if unknown:
        keys = schema_keys(schema)
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(unknown_key_message(k, keys) for k in unknown))
    if cfg.task.reward_modules:
        warnings.warn(REWARD_MODULES_DEPRECATED, FutureWarning, stacklevel=2)
        with open_dict(cfg):
            cfg.plugins = list(dict.fromkeys([*cfg.plugins, *cfg.task.reward_modules]))
    return OmegaConf.to_object(cfg)


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train") -> tuple[TrainConfig, DictConfig]:
    """Both phases, as the CLI runs them: the typed config and the composed DictConfig."""
    steps = plan(list(overrides))
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name, overrides=steps.hydra)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__ or err.__context__
        detail = f" ({str(cause).splitlines()[0]})" if cause is not None else ""
        raise ConfigError(f"{str(err).splitlines()[0]}{detail}") from None
    return finish(cfg, steps.deferred), cfg
