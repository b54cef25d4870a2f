"""Two-phase composition of the Hydra config groups (``grpo_lightning/conf``) onto :class:`TrainConfig`.

Phase 1 reads ``plugins=[...]`` (and ``task.reward_modules=[...]``, the TRL-style reward files) from the
overrides and imports them, so whatever they register exists, and stores the schema with a node
for each registered entry's options (:func:`store_schema`: ``algorithm.sapo``, ``health.<check>``);
then it finds the chosen task
(``task.name=``, else the ``task`` group option Hydra's defaults list picks, presets included)
and checks the overrides' keys against the schema with that task's own options class
(``TASKS.options(name)``): ``task.max_operand`` is a field under ``task=arithmetic`` and an
unknown key under ``task=dataset``. Hydra composes the same: each conf/task/<name>.yaml starts
from ``task_schema/<name>``, the options the task registered. Phase 2 composes every group onto that schema, then refuses any key the schema
does not declare, ``+`` or not (Hydra's ``+`` adds keys silently), naming the closest real one.
``task.rewards={...}`` (any dict-typed field) assigns: the override is held back from Hydra,
which would merge it key-wise, and applied after.

The tasks register into :data:`~grpo_lightning.config.task.TASKS` (this layer imports none of
them). The CLI (``grpo_lightning.train``) runs phase 1 on ``sys.argv`` before ``@hydra.main``
and :func:`finish` on what Hydra composed; :func:`compose` does both for Python and tests.
"""

from __future__ import annotations

import sys
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from grpo_lightning.config.base import unknown_key_message
from grpo_lightning.config.effective import apply_model_defaults
from grpo_lightning.config.nodes import with_plugin_nodes
from grpo_lightning.config.task import TASKS, TaskConfig
from grpo_lightning.config.train import TrainConfig
from grpo_lightning.config.trl_names import trl_alias, trl_problem
from grpo_lightning.errors import ConfigError
from grpo_lightning.registry import load_plugins

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
DEFAULT_TASK = "arithmetic"  # conf/train.yaml's defaults list picks it


def schema(task: str = DEFAULT_TASK) -> TrainConfig:
    """The schema for ``task``: the dataclass defaults, with the task's own options class, except that task.rewards is empty and every conf/task/*.yaml names its own rewards.

    Hydra merges dicts key-wise and a config file cannot replace or delete one (Hydra issue
    #1896): a task file's rewards merged onto the arithmetic default would keep the arithmetic
    rewards too. TaskConfig keeps the arithmetic rewards as its default because TrainConfig() in
    Python is the arithmetic task and must run as it is, so conf/task/arithmetic.yaml names the
    same rewards (tests/unit/config/test_config.py checks they agree)."""
    cls = (TASKS.options(task) if task in TASKS else None) or TaskConfig
    return with_plugin_nodes(TrainConfig)(task=cls(rewards={}))


SCHEMA = TrainConfig(task=TaskConfig(rewards={}))  # what Hydra composes onto; each task file adds its options
ConfigStore.instance().store(name="train_schema", node=SCHEMA)


def schema_paths(node: Any, prefix: str = "") -> tuple[list[str], set[str]]:
    """Every dotted field path of a config instance (nested groups and the chosen task's own
    options class included), and the paths of its dict-typed fields (task.rewards, ...)."""
    keys, dicts = [], set()
    hints = typing.get_type_hints(type(node))
    for f in fields(node):
        path, value = prefix + f.name, getattr(node, f.name)
        keys.append(path)
        if is_dataclass(value):
            more, more_dicts = schema_paths(value, path + ".")
            keys += more
            dicts |= more_dicts
        elif typing.get_origin(hints[f.name]) is dict:
            dicts.add(path)
    return keys, dicts


@dataclass
class Plan:
    """Phase 1's result: the overrides Hydra composes, and those applied after it (in order)."""

    hydra: list[str] = field(default_factory=list)
    deferred: list[Override] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    explicit: set[str] = field(default_factory=set)  # keys the command line sets: a model's defaults leave them
    task: str | None = DEFAULT_TASK  # None: a task file of the user's own, known once composed


def _parse(text: str) -> Override | None:
    if text.startswith("-") or ("=" not in text and not text.startswith("~")):
        return None  # a Hydra flag (--cfg job, -m) or its argument
    try:
        return OverridesParser.create().parse_override(text)
    except HydraException:
        return None  # Hydra reports it


def _plain(o: Override) -> bool:
    """A single-value override that sets something (not a sweep, not a deletion)."""
    return o.type != OverrideType.DEL and not o.is_sweep_override()


def _store_plugin_tasks() -> None:
    """A registered task without a conf/task/<name>.yaml gets its options' defaults as that group
    option, so ``task=<name>`` selects a task registered by a plugin file."""
    store = ConfigStore.instance()
    for name in TASKS:
        cls = TASKS.options(name)
        if cls is not None and not (CONF_DIR / "task" / f"{name}.yaml").exists():
            store.store(group="task", name=name, node=cls())


def _defaults_choice(texts: list[str], config_name: str) -> str | None:
    """The ``task`` option Hydra's defaults list picks for these overrides (presets included)."""

    def choose() -> str | None:
        loader = GlobalHydra.instance().config_loader()
        for d in loader.compute_defaults_list(config_name, texts, RunMode.RUN).defaults:
            if d.config_path and d.config_path.startswith("task/"):
                return d.config_path.split("/", 1)[1]
        return None

    try:
        if GlobalHydra.instance().is_initialized():
            return choose()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return choose()
    except (HydraException, OmegaConfBaseException):
        return None  # Hydra reports it when it composes


def _config_dir_searchpath(args: list[str], texts: list[str]) -> list[str]:
    """``--config-dir DIR`` (``-cd DIR``) as the override Hydra's defaults list understands."""
    if any(t.startswith("hydra.searchpath") for t in texts):
        return []
    for i, arg in enumerate(args):
        if arg.startswith("--config-dir="):
            folder = arg.split("=", 1)[1]
        elif arg in ("--config-dir", "-cd") and i + 1 < len(args):
            folder = args[i + 1]
        else:
            continue
        return [f"hydra.searchpath=[file://{Path(folder).resolve()}]"]
    return []


def _chosen_task(parsed: list[tuple[str, Override | None]], config_name: str) -> str | None:
    """``task.name=`` if given, else the ``task`` group option chosen; an unknown name names the closest.

    None when the option is a file of the user's own (``--config-dir``): its task is known only
    once composed, and :func:`finish` checks its keys then."""
    name, group = None, None
    for _, o in parsed:
        if o is not None and _plain(o) and o.key_or_group in ("task", "task.name"):
            if o.key_or_group == "task":
                group = str(o.value())
            else:
                name = str(o.value())
    if name is not None:
        if (problem := TASKS.problem(name, "task.name")) is not None:
            raise ConfigError(problem)
        return name
    texts = [t for t, o in parsed if o is not None and not o.is_sweep_override()]
    choice = _defaults_choice(texts + _config_dir_searchpath([t for t, _ in parsed], texts), config_name)
    if choice is None and group is not None and (problem := TASKS.problem(group, "task")) is not None:
        raise ConfigError(problem)  # no such option: name the closest task
    return choice if choice in TASKS else None


def _unknown_override_keys(
    parsed: list[tuple[str, Override | None]], keys: list[str], dicts: set[str], task: str | None
) -> None:
    """Refuse ``group.key=value`` for a key the schema lacks, before Hydra (whose own message
    names no alternative): names the closest real key, and the tasks that have it. The task's
    keys are left to :func:`finish` when the task is not known yet (``task``: None)."""
    known, problems = set(keys), []
    heads = {k for k in keys if "." not in k} - ({"task"} if task is None else set())
    groups = {d.name for d in CONF_DIR.iterdir() if d.is_dir()} | {"hydra", "task"}
    for _, o in parsed:
        if o is None or not _plain(o):
            continue
        key = o.key_or_group
        head = key.split(".", 1)[0]
        if head not in heads and head not in groups and head not in known:  # bad.key=1, learning_rat=1
            problems.append(unknown_key_message(key, keys))
            continue
        if "." not in key or head not in heads or key in known or any(key.startswith(d + ".") for d in dicts):
            continue
        message = unknown_key_message(key, keys)
        if key.startswith("task."):
            owners = [n for n in TASKS if key.split(".")[1] in _fields_of(TASKS.options(n))]
            message += f" (task.{key.split('.')[1]} is an option of task={'/'.join(owners)})" if owners else ""
        problems.append(message)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _fields_of(cls: type | None) -> set[str]:
    return {f.name for f in fields(cls)} if cls is not None else set()


def trl_overrides(overrides: list[str] | tuple[str, ...], say: bool = True) -> list[str]:
    """TRL's ``GRPOConfig`` names renamed to ours where they mean the same (``learning_rate=1e-6``
    -> ``algorithm.lr=1e-6``, said on stderr); a TRL name whose meaning differs is an error that
    names our key and the value to write (config/trl_names.py)."""
    out, problems = [], []
    top = {f.name for f in fields(TrainConfig)}
    for text in overrides:
        o = _parse(text)
        key = o.key_or_group if o is not None else ""
        if o is None or "." in key or key in top or not _plain(o):
            out.append(text)
        elif o.type == OverrideType.CHANGE and (ours := trl_alias(key)) is not None:
            out.append(f"{ours}={text.split('=', 1)[1]}")
            if say:
                print(f"note: TRL's {key} is {ours} here", file=sys.stderr)
        elif (problem := trl_problem(key, o.value())) is not None and o.type == OverrideType.CHANGE:
            problems.append(problem)
        else:
            out.append(text)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    return out


def plan(overrides: list[str] | tuple[str, ...], load: bool = True, config_name: str = "train") -> Plan:
    """Phase 1: rename TRL's names, import ``plugins`` / ``task.reward_modules``, store the chosen
    task's schema, refuse unknown keys and hold back dict assignments."""
    parsed = [(text, _parse(text)) for text in trl_overrides(overrides)]
    result = Plan()
    for _, o in parsed:
        if o is not None and o.key_or_group in ("plugins", "task.reward_modules") and _plain(o):
            entries = o.value()
            entries = [entries] if isinstance(entries, str) else list(entries or [])
            if load:
                load_plugins(entries, field=o.key_or_group)
            result.plugins += entries
    _store_plugin_tasks()
    store_schema()
    result.task = _chosen_task(parsed, config_name)
    keys, dicts = schema_paths(schema(result.task or DEFAULT_TASK))
    if result.task is None:  # any task's dict fields (task.dataset_options) assign
        dicts |= {d for name in TASKS for d in schema_paths(schema(name))[1]}
    _unknown_override_keys(parsed, keys, dicts, result.task)
    held: set[str] = set()
    for text, o in parsed:
        if o is None:
            result.hydra.append(text)
            continue
        key = o.key_or_group
        result.explicit.add(key)
        whole_dict = o.type == OverrideType.CHANGE and key in dicts and not o.is_sweep_override()
        if whole_dict and isinstance(o.value(), dict):
            held.add(key)
        if any(key == k or key.startswith(k + ".") for k in held):
            result.deferred.append(o)
        else:
            result.hydra.append(text)
    return result


def run_dir_follows_output_dir(overrides: list[str]) -> list[str]:
    """The CLI's overrides with ``hydra.run.dir`` set to a ``trainer.output_dir`` the command line
    names (and no ``hydra.run.dir``): Hydra's ``.hydra/`` and ``train.log`` then land beside the
    checkpoints instead of in a timestamped ``outputs/`` folder, which two runs started in the
    same second would share (the second refused by the run lock)."""
    named = {}
    for text in overrides:
        o = _parse(text)
        if o is not None and o.type == OverrideType.CHANGE and not o.is_sweep_override():
            named[o.key_or_group] = text.split("=", 1)[1]
    if "trainer.output_dir" not in named or "hydra.run.dir" in named:
        return list(overrides)
    return [*overrides, f"hydra.run.dir={named['trainer.output_dir']}"]


def store_schema() -> type[TrainConfig]:
    """Store the schema with a node per registered entry's options (``algorithm.sapo``,
    ``health.<check>``; config/nodes.py) for Hydra; run after the plug-ins are imported."""
    built = with_plugin_nodes(TrainConfig)
    ConfigStore.instance().store(name="train_schema", node=built(task=TaskConfig(rewards={})))
    return built


def _apply(cfg: DictConfig, o: Override) -> None:
    key = o.key_or_group
    with open_dict(cfg):
        if o.type == OverrideType.DEL:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent)
            if node is None or leaf not in node:
                raise ConfigError(f"~{key}: there is no {key} to delete")
            del node[leaf]
        elif _is_dict_field(cfg, key):  # assign, do not merge
            OmegaConf.update(cfg, key, o.value(), merge=False)
        else:
            OmegaConf.update(cfg, key, o.value(), merge=True)


def _is_dict_field(cfg: DictConfig, key: str) -> bool:
    node = OmegaConf.select(cfg, key, default=None)
    return isinstance(node, DictConfig) and not is_dataclass(OmegaConf.get_type(node))


def unknown_keys(node: Any, cls: type, prefix: str = "") -> list[str]:
    """Keys of a composed config that the schema ``cls`` does not declare (dict fields are open).

    A nested group's schema is its node's own type (the chosen task's options class for ``task``)."""
    hints = typing.get_type_hints(cls)
    found = []
    for key in node:
        if key not in hints:
            found.append(f"{prefix}{key}")
        elif is_dataclass(hints[key]) and isinstance(node[key], DictConfig):
            kind = OmegaConf.get_type(node[key])
            found += unknown_keys(node[key], kind if is_dataclass(kind) else hints[key], f"{prefix}{key}.")
    return found


def finish(cfg: DictConfig, deferred: list[Override] = (), explicit: set[str] = frozenset()) -> TrainConfig:
    """Phase 2's end: apply held-back overrides, refuse unknown keys, put the model's defaults in
    place of group defaults not in ``explicit`` (config/effective.py), return the typed config.

    ``cfg`` is changed in place (it is what the logger records)."""
    for o in deferred:
        try:
            _apply(cfg, o)
        except OmegaConfBaseException as err:  # its first line; the rest is OmegaConf's internals
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(f"invalid override {o.input_line!r}: {first}") from None
    built = with_plugin_nodes(TrainConfig)
    unknown = unknown_keys(cfg, built)
    task_cls = OmegaConf.get_type(cfg.task) if isinstance(cfg.get("task"), DictConfig) else None
    task_cls = task_cls if is_dataclass(task_cls) else TaskConfig
    if unknown:
        keys = schema_paths(built(task=task_cls()))[0]
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(unknown_key_message(k, keys) for k in unknown))
    name = cfg.task.name
    if name in TASKS and TASKS.options(name) not in (None, task_cls):
        raise ConfigError(
            f"task.name={name!r} was set where the composed task options are {task_cls.__name__}; "
            f"choose the task with task={name} instead"
        )
    if cfg.task.reward_modules:  # imported like plugins; their top-level functions are rewards by name
        with open_dict(cfg):
            cfg.plugins = list(dict.fromkeys([*cfg.plugins, *cfg.task.reward_modules]))
    built = OmegaConf.to_object(cfg)
    for key, value in apply_model_defaults(built, explicit).items():
        OmegaConf.update(cfg, key, value)
    return built


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train") -> tuple[TrainConfig, DictConfig]:
    """Both phases, as the CLI runs them: the typed config and the composed DictConfig."""
    steps = plan(list(overrides), config_name=config_name)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name, overrides=steps.hydra)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__ or err.__context__
        detail = f" ({str(cause).splitlines()[0]})" if cause is not None else ""
        raise ConfigError(f"{str(err).splitlines()[0]}{detail}") from None
    return finish(cfg, steps.deferred, steps.explicit), cfg
