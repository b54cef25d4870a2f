"""A task is one registered file: its options are found through TASKS at composition time, a
user's own task comes in through plugins=[file.py], and every task-specific key is checked
against the chosen task's own options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grpo_lightning.build import build_datamodule
from grpo_lightning.config import ConfigError, TaskConfig, TrainConfig, UnknownFieldError, validate_config
from grpo_lightning.config.compose import CONF_DIR, compose
from grpo_lightning.tasks import TASKS, ArithmeticTaskConfig, DatasetTaskConfig, GsmTaskConfig, task_records

OUT = "trainer.output_dir=/tmp/unused"

# A whole task in one file outside the package: options, records and its own reward.
PLUGIN_TASK = """
from dataclasses import dataclass
from typing import Optional

from grpo_lightning.config.base import option
from grpo_lightning.config.task import TaskConfig, task_name
from grpo_lightning.rewards import register_reward
from grpo_lightning.tasks import TASKS, checked, split


@dataclass
class CountingConfig(TaskConfig):
    name: str = task_name("counting_plugin")
    start: int = option(0, "The first number counted from.")
    rewards: dict[str, float] = option({"counting_plugin_exact": 1.0}, "Rewards.")
    correctness_reward: Optional[str] = option("counting_plugin_exact", "Correct.")


@TASKS.register("counting_plugin", options=CountingConfig)
def counting(options, check=None):
    records = [{"prompt": f"{options.start + i}+1=", "answer": str(options.start + i + 1)} for i in range(10)]
    train, val = split(records, options.val_fraction)
    return checked(options.name, train, val, check)


@register_reward("counting_plugin_exact")
def counting_plugin_exact(prompts, completions, answer, **_):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
"""


def cli_config(cwd: Path, *args: str):
    """The config the CLI composes for ``args`` (``--cfg job``), as an OmegaConf node."""
    command = [sys.executable, "-m", "grpo_lightning.train", *args, "--cfg", "job"]
    result = subprocess.run(command, cwd=cwd, env=os.environ, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return OmegaConf.create(result.stdout)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugin") / "counting_task.py"
    path.write_text(PLUGIN_TASK)
    return path


def test_a_task_from_a_plugin_file_is_composed_and_its_option_changes_its_prompts(plugin):
    cfg, raw = compose([OUT, f"plugins=[{plugin}]", "task=counting_plugin", "task.start=50"])
    assert type(cfg.task).__name__ == "CountingConfig" and cfg.task.start == 50
    assert cfg.task.rewards == {"counting_plugin_exact": 1.0}  # the task's own rewards
    assert raw.task.start == 50  # what the logger records
    validate_config(cfg)  # its reward is registered, its name known
    cfg.rollout.prompts_per_step = 1
    prompts = {r["prompt"] for r in build_datamodule(cfg).train_records}
    assert prompts and all(50 <= int(p.split("+")[0]) < 60 for p in prompts)
    other, _ = compose([OUT, f"plugins=[{plugin}]", "task=counting_plugin"])
    other.rollout.prompts_per_step = 1
    assert {r["prompt"] for r in build_datamodule(other).train_records}.isdisjoint(prompts)
    with pytest.raises(ConfigError, match=r"task.stat is not a config field; did you mean task.start\?"):
        compose([OUT, f"plugins=[{plugin}]", "task=counting_plugin", "task.stat=5"])


@pytest.mark.slow
def test_the_cli_takes_a_plugin_task_and_its_option(plugin, tmp_path):
    shown = cli_config(tmp_path, f"plugins=[{plugin}]", "task=counting_plugin", "task.start=7")
    assert (shown.task.name, shown.task.start) == ("counting_plugin", 7)


@pytest.mark.parametrize("plus", ["", "+"])
def test_a_key_of_another_task_is_refused_naming_the_task_that_has_it(plus):
    with pytest.raises(ConfigError) as err:
        compose([OUT, "task=dataset", "task.path=p.jsonl", f"{plus}task.max_operand=5"])
    assert "task.max_operand is not a config field" in str(err.value)
    assert "task.max_operand is an option of task=arithmetic" in str(err.value)
    with pytest.raises(
        ConfigError, match=r"task.prompt_colum is not a config field; did you mean task.prompt_column\?"
    ):
        compose([OUT, "task=dataset", f"{plus}task.prompt_colum=q"])
    assert compose([OUT, "task=arithmetic", "task.max_operand=20"])[0].task.max_operand == 20


def test_a_key_of_another_task_is_refused_in_python_too():
    with pytest.raises(UnknownFieldError, match="did you mean 'prompt_column'"):
        DatasetTaskConfig().prompt_colum = "q"
    with pytest.raises(AttributeError):
        DatasetTaskConfig().max_operand = 5


def test_an_unknown_task_name_names_the_closest_at_config_time():
    with pytest.raises(ConfigError, match=r"task='arithmetc' is not a registered task; did you mean 'arithmetic'\?"):
        compose([OUT, "task=arithmetc"])
    with pytest.raises(ConfigError, match=r"task.name='gsn' is not a registered task; did you mean 'gsm'\?"):
        validate_config(TrainConfig(task=TaskConfig(name="gsn")))


def test_the_python_api_takes_a_tasks_own_options_or_the_base_with_its_defaults():
    assert isinstance(TrainConfig().task, ArithmeticTaskConfig)  # the default run is the arithmetic task
    cfg = TrainConfig(task=ArithmeticTaskConfig(max_operand=20))
    validate_config(cfg)
    assert len(task_records(cfg.task)[0]) + len(task_records(cfg.task)[1]) == 21 * 21
    base = TaskConfig(name="arithmetic", val_fraction=0.5)
    train, val = task_records(base)  # promoted: the arithmetic defaults, the base's own fields kept
    assert (len(train), len(val)) == (50, 50)
    promoted = TaskConfig(name="gsm", seed=3).promoted()
    assert isinstance(promoted, GsmTaskConfig) and (promoted.size, promoted.seed) == (100, 3)
    with pytest.raises(ConfigError, match=r"task.name='gsm' but the options are a ArithmeticTaskConfig"):
        validate_config(TrainConfig(task=ArithmeticTaskConfig(name="gsm")))
    with pytest.raises(ConfigError, match=r"task.operators='\+/' must be one or more of"):
        validate_config(TrainConfig(task=ArithmeticTaskConfig(operators="+/")))


@pytest.mark.parametrize("path", sorted((CONF_DIR / "task").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_task_file_composes_to_its_registered_tasks_options(path):
    cfg, _ = compose([OUT, f"task={path.stem}"])
    assert path.stem in TASKS
    assert type(cfg.task) is TASKS.options(path.stem) and cfg.task.name == path.stem


def test_no_code_branches_on_task_names():
    """A task is found through the registry, never by an if/elif on its name."""
    root = Path(__file__).resolve().parents[3] / "grpo_lightning"
    offenders = [
        f"{p.relative_to(root)}:{n}"
        for p in root.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "task.name ==" in line or "task.name !=" in line or "task.name in (" in line
    ]
    assert offenders == []


@pytest.mark.slow
def test_a_task_file_of_your_own_starts_from_a_shipped_one(tmp_path):
    """README: my_conf/task/sums99.yaml with defaults [arithmetic] composes as the arithmetic task."""
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "sums99.yaml").write_text("defaults:\n  - arithmetic\n  - _self_\nmax_operand: 99\n")
    shown = cli_config(tmp_path, "--config-dir", str(tmp_path), "task=sums99")
    assert (shown.task.name, shown.task.max_operand, shown.task.operators) == ("arithmetic", 99, "+")
