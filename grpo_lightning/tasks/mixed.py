"""``task=mixed``: several tasks in one run, each with its own rewards, weight and evaluation.

``task.sources`` maps a source name to one registered task's options (``name``: the task)
plus ``rewards``, ``correctness_reward`` and a sampling ``weight``. Every record gets the
column ``data_source`` (its source's name), which routes it to its source's rewards
(:class:`~grpo_lightning.rewards.routing.SourceRouter`), draws it with its source's weight
(:class:`~grpo_lightning.data.mixture.MixtureSampler`) and reports its metrics apart
(``reward/<source>/...``, ``val/<source>/accuracy``). docs/rewards.md#mixed-task-runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Optional

from grpo_lightning.config import TrainConfig, register_config_check
from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.errors import RewardError
from grpo_lightning.registry import closest
from grpo_lightning.rewards.lookup import reward_problem
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS, register_reward
from grpo_lightning.rewards.routing import CORRECTNESS, SOURCE_COLUMN, SourceRouter
from grpo_lightning.rewards.scorer import RewardScorer
from grpo_lightning.tasks.base import Check, task_records

OWN_KEYS = ("weight",)  # keys of a source that are not its task's options
REQUIRED = ("name", "rewards")


@dataclass
class MixedTaskConfig(TaskConfig):
    name: str = task_name("mixed")
    sources: dict[str, Any] = option(
        {}, "Source -> {name: <task>, rewards: {fn: w}, correctness_reward, weight, <task options>}; one dataset each."
    )
    rewards: dict[str, float] = option(
        {}, "Rewards added to every source's own sources.<s>.rewards (e.g. a format one)."
    )
    # Optional, not str | None: OmegaConf reads the type of a field to check overrides.
    correctness_reward: Optional[str] = option(  # noqa: UP045
        CORRECTNESS, f"{CORRECTNESS}: each source's own correctness_reward decides (val/<source>/accuracy); null: none."
    )

    def source_options(self) -> dict[str, TaskConfig]:
        """Each source as its task's own options (the mixed task's seed and val_fraction unless it sets them)."""
        out = {}
        for source, spec in self.sources.items():
            spec = dict(spec)
            options_cls = TASKS.options(spec["name"]) or TaskConfig
            given = {k: v for k, v in spec.items() if k not in OWN_KEYS}
            inherited = {"seed": self.seed, "val_fraction": self.val_fraction, "correctness_reward": None}
            options = options_cls(**{**inherited, **given})
            options.rewards = {**self.rewards, **dict(spec["rewards"])}
            out[source] = options
        return out

    def weights(self) -> dict[str, float]:
        """Source -> sampling weight (1 unless set), in the order of ``sources``."""
        return {source: float(dict(spec).get("weight", 1.0)) for source, spec in self.sources.items()}

    def check_fields(self, p: str) -> list[str]:
        problems = [q for q in super().check_fields(p) if not q.startswith(f"{p}rewards is empty")]
        check(problems, bool(self.sources), f"{p}sources is empty; name at least one source: {{name: <task>, rewards}}")
        check(
            problems,
            self.correctness_reward in (CORRECTNESS, None),
            f"{p}correctness_reward={self.correctness_reward!r}: task=mixed takes {CORRECTNESS} or null; "
            f"set each source's own as {p}sources.<source>.correctness_reward",
        )
        for source, spec in self.sources.items():
            problems.extend(_source_problems(f"{p}sources.{source}.", source, spec))
        if problems:
            return problems
        for source, options in self.source_options().items():
            problems.extend(options.check_fields(f"{p}sources.{source}."))
        return problems


def _source_problems(p: str, source: str, spec: Any) -> list[str]:
    """What must hold before the source can become its task's options."""
    if not hasattr(spec, "keys"):
        return [f"{p[:-1]}={spec!r} must be a mapping {{name: <task>, rewards: {{fn: weight}}, ...}}"]
    problems = [f"{p}{key} is required" for key in REQUIRED if key not in spec]
    check(problems, source not in REWARD_FUNCTIONS, f"{p[:-1]}: a source may not share a reward function's name")
    if "name" not in spec:
        return problems
    if (problem := TASKS.problem(spec["name"], f"{p}name")) is not None:
        return [*problems, problem]
    check(problems, spec["name"] != "mixed", f"{p}name=mixed: a source is one task, not another mixture")
    weight = spec.get("weight", 1.0)
    check(
        problems,
        isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0,
        f"{p}weight={weight!r} must be a finite number > 0",
    )
    valid = [f.name for f in fields(TASKS.options(spec["name"]) or TaskConfig)]
    for key in spec:
        if key not in valid and key not in OWN_KEYS:
            hint = closest(key, [*valid, *OWN_KEYS])
            problems.append(
                f"{p}{key} is not an option of task={spec['name']}{f'; did you mean {hint!r}?' if hint else ''}"
            )
    return problems


@register_config_check
def source_reward_problems(cfg: TrainConfig) -> list[str]:
    """Unknown reward names in any source's rewards or correctness_reward."""
    if not isinstance(cfg.task, MixedTaskConfig) or cfg.task.check_fields("task."):
        return []
    named = []
    for source, options in cfg.task.source_options().items():
        named += [(f"task.sources.{source}.rewards.{name}", name) for name in options.rewards]
        if options.correctness_reward is not None:
            named.append((f"task.sources.{source}.correctness_reward", options.correctness_reward))
    modules = cfg.plugin_entries()
    return [q for field, name in named if (q := reward_problem(name, modules, field)) is not None]


@TASKS.register("mixed", options=MixedTaskConfig)
def mixed_records(task: MixedTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    """Every source's records, tagged with ``data_source``; the validation records source after source."""
    train: list[dict] = []
    val: list[dict] = []
    for source, options in task.source_options().items():
        source_train, source_val = task_records(options, check)
        if options.correctness_reward is None:  # nothing defines correct there: not evaluated
            source_val = []
        instruction = dict(task.sources[source]).get("instruction", "")
        for record in source_train + source_val:
            record[SOURCE_COLUMN] = source
            if instruction and isinstance(record["prompt"], str):  # each source asks for its own answer format
                record["prompt"] = f"{record['prompt']}\n{instruction}"
        train += source_train
        val += source_val
    return train, val


def task_scorer(task: TaskConfig, modules: Sequence[str] = ()) -> RewardScorer | SourceRouter:
    """The run's scorer: ``task.rewards`` weighted, or per source for task=mixed; ``modules``: the
    files and modules whose top-level callables reward names may name (``task.reward_modules``, ``plugins``)."""
    if not isinstance(task, MixedTaskConfig):
        return RewardScorer.from_names(task.rewards, task.reward_timeout_s, modules, process=task.reward_process)
    sources = task.source_options()
    return SourceRouter(
        {
            s: RewardScorer.from_names(o.rewards, task.reward_timeout_s, modules, process=task.reward_process)
            for s, o in sources.items()
        },
        {s: o.correctness_reward for s, o in sources.items()},
        modules,
    )


def source_weights(task: TaskConfig) -> dict[str, float] | None:
    """Source -> sampling weight for task=mixed; None for a single-source task."""
    return task.weights() if isinstance(task, MixedTaskConfig) else None


@register_reward(CORRECTNESS)
def source_correctness(prompts: list, completions: list, **_) -> list[float]:
    """A name, not a function: task=mixed scores each sample with its own source's correctness_reward."""
    raise RewardError(
        f"{CORRECTNESS} is computed by task=mixed from each source's correctness_reward; "
        "it cannot be one of task.rewards or a single task's correctness_reward"
    )
