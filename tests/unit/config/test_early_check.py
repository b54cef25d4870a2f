"""The CLI's first check: config errors found without importing torch, transformers or vLLM, and
nothing refused that the full composition would accept."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_lightning.algorithm import ADVANTAGE_SCALES, IS_LEVELS, KL_ESTIMATORS
from grpo_lightning.algorithm.corrections import CORRECTION_MODES
from grpo_lightning.algorithm.lr_schedule import LR_SCHEDULES
from grpo_lightning.algorithm.truncation import TRUNCATED_SAMPLING
from grpo_lightning.config import TASKS, AlgorithmConfig, ConfigError, field_help
from grpo_lightning.config.early import early_check

HEAVY = ("torch", "transformers", "lightning", "vllm")
PROBE = """
import sys
from grpo_lightning.config.early import early_check
from grpo_lightning.errors import ConfigError
for argv in ({bad!r}, {good!r}, {typo!r}):
    try:
        early_check(list(argv))
    except ConfigError as err:
        print("ERROR", str(err).splitlines()[-1])
print("HEAVY", sorted(m for m in {heavy!r} if m in sys.modules))
"""


def test_the_early_check_imports_no_heavy_library():
    good = ("rollout.num_generations=4", "+preset=dapo")
    code = PROBE.format(bad=("bad.key=1",), good=good, typo=("algorithm.policy_loss=grpp",), heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "ERROR   - bad.key is not a config field" in out
    assert "ERROR   - algorithm.policy_loss='grpp' is not a registered policy loss" in out
    assert out.count("ERROR") == 2
    assert "HEAVY []" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["algorithm.learning_rate=1"], "did you mean algorithm.lr?"),
        (["bad.key=1"], "bad.key is not a config field"),
        (["rollout.num_generations=1"], "rollout.num_generations=1 must be >= 2"),
        (["algorithm.beta=-1"], "algorithm.beta=-1.0 must be >= 0"),
        (["rollout.temperature=abc"], "could not be converted to Float"),
        (["+preset=dapo", "task.overlong_buffer_tokens=10"], "task.overlong_buffer_tokens=10 must be in"),
        (["per_device_train_batch_size=16"], "did you mean rollout.prompts_per_step?"),
        (["model=smollm2_135m", "rollout.top_p=2"], "rollout.top_p=2.0 must be in (0, 1]"),
        (
            ["algorithm.policy_loss=grpp"],
            "algorithm.policy_loss='grpp' is not a registered policy loss; did you mean 'grpo'?",
        ),
        (["algorithm.beta=-1", "algorithm.loss_agg=avg"], "algorithm.beta=-1.0 must be >= 0"),  # and loss_agg: below
        (["task=guess_numbr"], "task='guess_numbr' is not a registered task; did you mean 'guess_number'?"),
        (["task.name=gsn"], "task.name='gsn' is not a registered task; did you mean 'gsm'?"),
        (["algorithm.corrections=[icepp]"], "did you mean 'icepop'?"),
        (["algorithm.lr_schedule=cosin"], "choose one of ['constant', 'linear', 'cosine']"),
        (["rollout.engine=hff"], "rollout.engine='hff' is not a registered rollout engine; did you mean 'hf'?"),
        (["task.rewards={formt: 1.0}"], "task.rewards.formt='formt' is not a registered reward function"),
        (["task.rewards.arithmetic_exactt=1"], "did you mean 'arithmetic_exact'?"),
        (["task.correctness_reward=gsm_exat"], "did you mean 'gsm_exact'?"),
        (["rewards.bogus=1"], "rewards.bogus is not a config field"),
    ],
)
def test_errors_found_early(argv, message):
    with pytest.raises(ConfigError) as err:
        early_check(argv)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["learning_rate=1e-6", "num_generations=4"],
        ["task.max_operand=-3"],  # a task's own option: judged once the task is registered
        ["algorithm.sapo.tau_pos=-1"],  # a registered loss's node
        ["algorithm.beta=-1", "algorithm.sapo.tau_pos=-1"],  # the full path lists both problems at once
        ["algorithm.policy_loss=grpp", "task.max_operand=3"],
        ["'task.rewards={formt: .nan}'"],  # the weight is the full path's to judge, with the name
        ["'task.rewards={pkg.module:fn: 1.0}'"],  # an import path
        ["algorithm.corrections=[icepop]", "algorithm.lr=-1"],  # a valid list: its rules need the classes
        ["rollout.num_generations=1", "task.max_operand=3"],
        ["plugins=[my_rewards.py]", "bad.key=1"],  # plug-ins may add anything: the full path judges
        ["task.reward_modules=[my_rewards.py]", "'task.rewards={my_reward: 1.0}'"],
        ["task=mixed", "algorithm.lr=-1"],  # its file sets sources, an option of its own class
        ["hydra.searchpath=[file:///my/conf]", "task=my_task"],  # a task option of the user's folder
        ["+preset=smollm2_reasoning_gym", "task.dataset=chain_sum"],
        ["task=gsm", "rollout=vllm", "algorithm=dapo", "logger=csv"],
        ["task=code", "rewards.code_tests.cpu_s=3", "rewards.code_tests.cpux=3"],  # a source's node (issue 46)
        ["rewards.judge.url=http://127.0.0.1:8000/v1", "rewards.judge.model=judge"],
        ["rewards.reward_model.path=/models/rm", "rewards.reward_model.dtype=bfloat16"],
    ],
)
def test_left_for_the_full_path(argv):
    early_check([a.strip("'") for a in argv])


def test_a_registered_name_lists_every_problem_with_it():
    with pytest.raises(ConfigError) as err:
        early_check(["algorithm.beta=-1", "algorithm.loss_agg=avg", "task=gsm", "task.rewards.gsm_exat=1"])
    lines = str(err.value).splitlines()
    assert len(lines) == 4 and "did you mean 'gsm_exact'?" in lines[-1]


def test_a_task_registered_in_this_process_is_left_for_the_full_path():
    TASKS.entries.setdefault("doubling_early", lambda *a: None)
    try:
        early_check(["task=doubling_early"])
    finally:
        TASKS.entries.pop("doubling_early")


def test_help_texts_written_without_the_registries_still_name_every_builtin():
    """config/algorithm.py no longer imports the registries for its help texts: they must not drift."""
    helps = field_help(AlgorithmConfig)
    for field, names in (
        ("kl_estimator", KL_ESTIMATORS.names),
        ("advantage_scale", ADVANTAGE_SCALES),
        ("is_level", IS_LEVELS),
        ("lr_schedule", LR_SCHEDULES),
        ("correction_mode", CORRECTION_MODES),
        ("truncated_sampling", TRUNCATED_SAMPLING),
    ):
        assert all(name in helps[field] for name in names), field
