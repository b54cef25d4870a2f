"""Tasks: each one file, ``tasks/<name>.py``, holding its records, its rewards and its options.

A task registers ``records(options, check) -> (train, val)`` in :data:`TASKS` with its options
dataclass (a subclass of :class:`~grpo_lightning.config.task.TaskConfig`)::

    @TASKS.register("my_task", options=MyTaskConfig)
    def my_task(options, check=None): ...

``task=my_task task.<option>=...`` then works from the CLI, including from a user's own file
given in ``plugins=[my_task.py]``. :data:`TASKS` is defined in the config layer (see
:mod:`grpo_lightning.config.task` for why) and re-exported here.
"""

from grpo_lightning.config.task import TASKS, TaskConfig
from grpo_lightning.tasks import (  # noqa: F401  (register the tasks)
    arithmetic,
    code,
    dataset,
    episodes,
    gsm,
    guess_number,
    key_lookup,
    mixed,
    reasoning_gym,
    shape_drawn,
    shapes,
)
from grpo_lightning.tasks.arithmetic import ArithmeticTaskConfig, arithmetic_records
from grpo_lightning.tasks.base import checked, split, task_records
from grpo_lightning.tasks.code import CodeTaskConfig
from grpo_lightning.tasks.dataset import DatasetTaskConfig
from grpo_lightning.tasks.gsm import GsmTaskConfig
from grpo_lightning.tasks.mixed import MixedTaskConfig, source_weights, task_scorer
from grpo_lightning.tasks.reasoning_gym import ReasoningGymTaskConfig

__all__ = [
    "TASKS",
    "ArithmeticTaskConfig",
    "CodeTaskConfig",
    "DatasetTaskConfig",
    "GsmTaskConfig",
    "MixedTaskConfig",
    "ReasoningGymTaskConfig",
    "TaskConfig",
    "arithmetic_records",
    "checked",
    "source_weights",
    "split",
    "task_scorer",
    "task_records",
]
