"""``task.*``: the options every task shares, and :data:`TASKS`, the registry of tasks.

A task (``grpo_lightning/tasks/<name>.py``, or a user's file given in ``plugins=[...]``) is one
thing: its records, its rewards and its own options, a subclass of :class:`TaskConfig` declared
in the task's file. The registry lives here, in the lowest layer, so the composition
(:mod:`.compose`) can find the chosen task's options class (``TASKS.options(name)``) while
importing nothing above the schema: the tasks register into it, the schema never imports them.

Registering a task also stores its options (with empty rewards) as the Hydra config
``task_schema/<name>``: ``conf/task/<name>.yaml`` starts from it (``/task_schema@_here_``), so
whatever composes that file gets the task's own fields and types, plain Hydra included.

:meth:`TaskConfig.promoted` turns a base instance into the named task's options with that
task's defaults for the rest, so ``TrainConfig(task=TaskConfig(name="gsm"))`` and
``TrainConfig(task=GsmTaskConfig(size=50))`` both work, and ``TrainConfig().task`` is the
arithmetic task's own options (``ArithmeticTaskConfig``) once the tasks are registered
(``import grpo_lightning`` registers them; the schema layer alone has only this base class). Reward names are checked where rewards live (:mod:`grpo_lightning.rewards`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from grpo_lightning.config.base import Schema, check, option
from grpo_lightning.registry import Registry, load_plugins

TASK_CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "task"
NAME_HELP = "The task: a name registered in grpo_lightning.tasks.TASKS (or by a plugin)."


def task_name(default: str):
    """The ``name`` field of a task's own options class: its default is that task."""
    return option(default, NAME_HELP)


@dataclass
class TaskConfig(Schema):
    name: str = task_name("arithmetic")
    val_fraction: float = option(0.2, "Share of the prompts held out for validation.")
    seed: int = option(0, "Seed of the train / validation split.")
    rewards: dict[str, float] = option(
        {"arithmetic_exact": 0.5, "arithmetic_close": 0.5},
        "Reward function name -> weight; the total reward is the weighted sum.",
    )
    reward_timeout_s: Optional[float] = option(
        600.0,
        "Seconds a reward function may take per batch (default 600); then the run stops naming it. Not for reward "
        "sources. null: none.",
    )
    reward_process: bool = option(
        False,
        "true: each reward function in a worker process killed at reward_timeout_s (stops C code too; no lambdas); "
        "false: in the trainer.",
    )
    correctness_reward: Optional[str] = option(
        "arithmetic_exact", "The reward whose score 1 means 'correct' (val/accuracy, val/pass@k); null: no evaluation."
    )
    system_prompt: Optional[str] = option(
        None, "System message put before each prompt by the chat template; null keeps the tokenizer's default."
    )
    instruction: str = option("", "Text appended to every question, e.g. how to format the answer; empty adds nothing.")
    truncate_prompts: bool = option(
        False, "Keep the last tokens of a prompt too long for the context and report it; false stops naming the row."
    )
    chat_template: bool = option(
        True, "Wrap prompts in the tokenizer's chat template when it has one (instruction-tuned models)."
    )
    max_completion_chars: int = option(
        0, "length_penalty: completions longer than this many characters lose reward; 0 turns it off."
    )
    overlong_buffer_tokens: int = option(
        0, "overlong_penalty: the penalty ramps over the last this many tokens of the budget; 0: a fifth of it."
    )
    reward_modules: list[str] = option(
        [], "Files or modules of reward functions: task.rewards names their top-level functions, plain or TRL-style."
    )
    model_defaults: dict[str, Any] = option(
        {}, "Defaults this task brings per model: {model.name_or_path: {dotted.key: value}}, applied where not set."
    )
    group_column: Optional[str] = option(
        None,
        "A column of the held-out records whose values each get their own val/<value>/ metrics (e.g. "
        "question_type); null: none.",
    )

    def promoted(self) -> TaskConfig:
        """These options as the named task's own options (:func:`task_options`: its class and
        conf/task file), keeping the fields set here to other than TaskConfig's defaults; ``self``
        when they already are the task's class, or when the name is not registered."""
        cls = TASKS.options(self.name) if self.name in TASKS else None
        if cls is None or isinstance(self, cls) or type(self) is not TaskConfig:
            return self
        base = TaskConfig(name=self.name)
        changed = {
            f.name: getattr(self, f.name) for f in fields(TaskConfig) if getattr(self, f.name) != getattr(base, f.name)
        }
        return task_options(self.name, **changed)

    def check_fields(self, p: str) -> list[str]:
        promoted = self.promoted()
        if promoted is not self:  # a base TaskConfig: check it as the task it names
            return promoted.check_fields(p)
        problems: list[str] = []
        if (problem := TASKS.problem(self.name, f"{p}name")) is not None:
            problems.append(problem)
        elif not isinstance(self, cls := TASKS.options(self.name) or TaskConfig):
            problems.append(
                f"{p}name={self.name!r} but the options are a {type(self).__name__}; "
                f"task={self.name} takes a {cls.__name__} (in Python: cfg.task = {self.name!r})"
            )
        check(problems, bool(self.rewards), f"{p}rewards is empty; name at least one reward function")
        check(
            problems,
            self.max_completion_chars >= 0,
            f"{p}max_completion_chars={self.max_completion_chars} must be >= 0 (0 = off)",
        )
        timeout = self.reward_timeout_s
        check(problems, timeout is None or timeout > 0, f"{p}reward_timeout_s={timeout} must be > 0 (null = no limit)")
        check(
            problems,
            timeout is not None or not self.reward_process,
            f"{p}reward_process=true needs {p}reward_timeout_s (the limit its worker is killed at), not null",
        )
        check(problems, 0 <= self.val_fraction < 1, f"{p}val_fraction={self.val_fraction} must be in [0, 1)")
        return problems


def task_options(name: str, **values) -> TaskConfig:
    """Task ``name``'s options as ``task=<name>`` composes them: its options class, then what
    conf/task/<name>.yaml sets (its rewards, correctness_reward, prompts), then ``values``. So
    switching the task in Python (``cfg.task = "gsm"``) resets every field that depends on it."""
    cls = TASKS.options(name) or TaskConfig
    file = TASK_CONF_DIR / f"{name}.yaml"
    # As compose.schema(): a task with a conf file starts from no rewards, and its file names them.
    from_file = {"rewards": {}, **OmegaConf.to_container(OmegaConf.load(file))} if file.is_file() else {}
    from_file.pop("defaults", None)
    return cls(**{**from_file, "name": name, **values})


class TaskRegistry(Registry):
    """The registry of tasks; each one's options also become the Hydra config ``task_schema/<name>``.

    The built-in tasks (``grpo_lightning.tasks``, which imports the rewards and torch) register on
    the first look at the entries, not when the package is imported: the CLI checks a command
    line before any heavy import."""

    builtin_module = "grpo_lightning.tasks"

    def __init__(self, kind: str, config_field: str):
        self._builtins_loaded = False
        super().__init__(kind, config_field)

    @property
    def entries(self) -> dict:
        if not self._builtins_loaded:
            self._builtins_loaded = True  # before the import: the tasks' own registrations read entries
            load_plugins([self.builtin_module])
        return self._entries

    @entries.setter
    def entries(self, value: dict) -> None:
        self._entries = value

    def add(self, name: str, entry, *, options: type | None = None):
        entry = super().add(name, entry, options=options)
        ConfigStore.instance().store(group="task_schema", name=name, node=(options or TaskConfig)(rewards={}))
        return entry


# task name -> records(options, check) -> (train, val), with the task's options dataclass.
TASKS: TaskRegistry = TaskRegistry("task", "task.name")
