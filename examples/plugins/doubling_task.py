"""A task of your own: its options, its prompts and its reward, in one file.

    grpo-lightning plugins=[examples/plugins/doubling_task.py] task=doubling task.max_value=20

``task.max_value`` is this task's own option: it exists only with ``task=doubling``, is
type-checked like every other field, and a typo in it names the closest key.
"""

from dataclasses import dataclass
from typing import Optional

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.rewards import register_reward
from grpo_lightning.tasks.base import checked, split


@dataclass
class DoublingConfig(TaskConfig):
    """Prompts ``n*2=`` with answer ``2n``."""

    name: str = task_name("doubling")
    max_value: int = option(9, "Largest n doubled.")
    rewards: dict[str, float] = option({"doubling_exact": 1.0}, "Reward function name -> weight.")
    # Optional, not str | None: OmegaConf reads the type of a field to check overrides.
    correctness_reward: Optional[str] = option("doubling_exact", "The reward whose 1 means correct.")  # noqa: UP045

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.max_value >= 4, f"{p}max_value={self.max_value} must be >= 4 (too few prompts)")
        return problems


@TASKS.register("doubling", options=DoublingConfig)
def doubling(options: DoublingConfig, check=None):
    """The task's records (train, validation): dicts with a prompt and any columns the rewards read."""
    records = [{"prompt": f"{n}*2=", "answer": str(2 * n)} for n in range(options.max_value + 1)]
    train, val = split(records, options.val_fraction)
    return checked(options.name, train, val, check)


@register_reward("doubling_exact")
def doubling_exact(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]
