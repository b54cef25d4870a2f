"""The command line checked before any heavy import: a typo answers in a second, not after torch.

:func:`early_check` runs first in the CLI. It imports only Hydra and the schema: no torch,
transformers, Lightning or vLLM, and none of the package's registries (the tasks, rewards,
losses and health checks register from modules that import torch). So it checks what needs no
registry: TRL's names (config/trl_names.py), unknown keys, Hydra's types on the composed groups
(presets and group choices applied), and the rules of the groups that name no registered entry
(raised here only when nothing on the command line is left for later, so that one message
still lists every problem).
Whatever it cannot judge it leaves, untouched, to the full composition and
:func:`~grpo_lightning.config.validate_config` that follow: a task's own options, registry
nodes (``algorithm.sapo.*``, ``health.<check>.*``), registered names, dict fields such as
``task.rewards``; and the whole command line when it names plug-in files or Hydra flags, whose
effect on the schema only importing them shows.
"""

from __future__ import annotations

import math
from dataclasses import fields

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_lightning.config.algorithm import AlgorithmConfig
from grpo_lightning.config.compose import (
    CONF_DIR,
    DEFAULT_TASK,
    _parse,
    _plain,
    _unknown_override_keys,
    schema_paths,
    trl_overrides,
)
from grpo_lightning.config.early_names import algorithm_name_problems, name_problem, reward_problem
from grpo_lightning.config.health import HealthConfig
from grpo_lightning.config.reward_sources import RewardSourcesConfig
from grpo_lightning.config.task import TaskConfig
from grpo_lightning.config.train import TrainConfig
from grpo_lightning.errors import ConfigError

# Groups whose rules name no registry: checked in full here.
PLAIN_GROUPS = ("model", "rollout", "trainer", "logger", "eval")
# Groups with nodes per registered entry: a key that is no field of theirs is left for later.
NODE_GROUPS = {
    "algorithm": AlgorithmConfig,
    "health": HealthConfig,
    "rewards": RewardSourcesConfig,
    "task": TaskConfig,
}
_LATER_KEYS = ("plugins", "task.reward_modules", "task.name")
REWARDS = "task.rewards"


def _names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def _later(o: Override, dicts: set[str]) -> bool:
    """An override only the full composition can judge (see the module docstring)."""
    key = o.key_or_group
    head, _, rest = key.partition(".")
    if key in _LATER_KEYS or any(key == d or key.startswith(d + ".") for d in dicts):
        return True
    if head not in NODE_GROUPS or not rest or rest.split(".")[0] in _names(NODE_GROUPS[head]):
        return False
    return head == "task" or "." in rest  # a task's own option; a node's key (algorithm.sapo.tau_pos)


def _task_files() -> set[str]:
    return {p.stem for p in (CONF_DIR / "task").glob("*.yaml")}


def _checkable(argv: list[str]) -> list[Override] | None:
    """The parsed overrides, or None when the command line is for the full path only.

    A task name no task has is refused here, as the full path would refuse it first."""
    parsed = []
    for text in argv:
        o = _parse(text)
        if o is None or not _plain(o) or o.key_or_group in ("plugins", "task.reward_modules"):
            return None  # a flag (--config-dir, -m, --cfg), a sweep or deletion, plug-ins
        if o.key_or_group.startswith("hydra.searchpath"):
            return None  # config folders of the user's, with options (tasks) of their own
        parsed.append(o)
    for o in parsed:
        if o.key_or_group in ("task", "task.name") and (
            problem := name_problem("task.name", str(o.value()), o.key_or_group)
        ):
            raise ConfigError(problem)
        if o.key_or_group == "task" and str(o.value()) not in _task_files():
            return None  # a task registered in this process without a conf file of its own
    chosen = [str(o.value()) for o in parsed if o.key_or_group == "task"]
    if not _only_shared_options(chosen[-1] if chosen else DEFAULT_TASK):
        return None  # the task's file sets options of its own class (task=mixed: sources)
    return parsed


def _only_shared_options(task: str) -> bool:
    """Whether conf/task/<task>.yaml sets only the options every task has: the stand-in
    schema below has no others."""
    keys = set(OmegaConf.load(CONF_DIR / "task" / f"{task}.yaml")) - {"defaults"}
    return keys <= _names(TaskConfig)


def _reward_names(parsed: list[Override], composed: dict[str, float]) -> tuple[list[tuple[str, str]], set[int]]:
    """(field, name) of every reward the command line and the task's file name, and the positions
    of the ``task.rewards`` overrides fully judged by checking those names (finite weights, no
    import paths)."""
    names, judged = dict.fromkeys(composed), set()
    for i, o in enumerate(parsed):
        key = o.key_or_group
        if key == REWARDS and isinstance(o.value(), dict):
            given = dict(o.value())
            names = dict.fromkeys(given)
        elif key.startswith(REWARDS + "."):
            given = {key[len(REWARDS) + 1 :]: o.value()}
            names.update(dict.fromkeys(given))
        else:
            continue
        if all(isinstance(w, int | float) and math.isfinite(w) and ":" not in str(n) for n, w in given.items()):
            judged.add(i)
    return [(f"{REWARDS}.{name}", str(name)) for name in names], judged


def _stand_in_task_schemas() -> None:
    """conf/task/<name>.yaml starts from the options its task registers (torch-side); the shared
    base options stand in for them here, and the real ones replace them when the tasks register."""
    store = ConfigStore.instance()
    stored = store.repo.get("task_schema", {})
    for name in _task_files():
        if f"{name}.yaml" not in stored:
            store.store(group="task_schema", name=name, node=TaskConfig(rewards={}))


def early_check(argv: list[str], config_name: str = "train") -> None:
    """Raise :class:`ConfigError` for what is wrong with ``argv`` that needs no heavy import."""
    argv = trl_overrides(argv, say=False)
    parsed = _checkable(argv)
    if parsed is None:
        return
    keys, dicts = schema_paths(TrainConfig(task=TaskConfig(rewards={})))
    kept = [o for o in parsed if not _later(o, dicts)]
    _unknown_override_keys([(o.input_line, o) for o in kept], keys, dicts, task=None)
    _stand_in_task_schemas()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name, overrides=[o.input_line for o in kept])
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__ or err.__context__
        detail = f" ({str(cause).splitlines()[0]})" if cause is not None else ""
        raise ConfigError(f"{str(err).splitlines()[0]}{detail}") from None
    if OmegaConf.is_interpolation(cfg.trainer, "output_dir"):
        cfg.trainer.output_dir = "."  # ${hydra:runtime.output_dir}: known only under @hydra.main
    built = OmegaConf.to_object(cfg)
    problems = [p for g in PLAIN_GROUPS for p in getattr(built, g).validate(f"{g}.")]
    named, complete = algorithm_name_problems(built.algorithm)
    problems += named + built.algorithm.value_problems("algorithm.")
    problems += TrainConfig.check_fields(built, "")
    rewards, judged = _reward_names(parsed, built.task.rewards)
    if built.task.correctness_reward is not None:
        rewards.append(("task.correctness_reward", built.task.correctness_reward))
    problems += [problem for field, name in rewards if (problem := reward_problem(name, field)) is not None]
    problems += [problem for problem in [name_problem("rollout.engine", built.rollout.engine)] if problem]
    # Every problem in one message: when the full path has more to judge, it lists them all.
    judged_all = complete and all(o in kept or i in judged for i, o in enumerate(parsed))
    if problems and judged_all:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
