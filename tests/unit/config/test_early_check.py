"""The CLI's first check: config errors found without importing torch, transformers or vLLM, and
nothing refused that the full composition would accept."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_lightning.config import ConfigError
from grpo_lightning.config.early import early_check

HEAVY = ("torch", "transformers", "lightning", "vllm")
PROBE = """
import sys
from grpo_lightning.config.early import early_check
from grpo_lightning.errors import ConfigError
for argv in ({bad!r}, {good!r}):
    try:
        early_check(list(argv))
    except ConfigError as err:
        print("ERROR", str(err).splitlines()[-1])
print("HEAVY", sorted(m for m in {heavy!r} if m in sys.modules))
"""


def test_the_early_check_imports_no_heavy_library():
    code = PROBE.format(bad=("bad.key=1",), good=("rollout.num_generations=4", "+preset=dapo"), heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "ERROR   - bad.key is not a config field" in out
    assert out.count("ERROR") == 1
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
        ["algorithm.policy_loss=grpp"],  # a registered name
        ["algorithm.beta=-1", "algorithm.loss_agg=avg"],  # the full path lists both problems at once
        ["rollout.num_generations=1", "task.max_operand=3"],
        ["plugins=[my_rewards.py]", "bad.key=1"],  # plug-ins may add anything: the full path judges
        ["task=doubling"],  # a plug-in's task
        ["'task.rewards={my_reward: 1.0}'"],
        ["+preset=smollm2_reasoning_gym", "task.dataset=chain_sum"],
        ["task=gsm", "rollout=vllm", "algorithm=dapo", "logger=csv"],
    ],
)
def test_left_for_the_full_path(argv):
    early_check([a.strip("'") for a in argv])


def test_help_texts_written_without_the_registries_still_name_every_builtin():
    """config/algorithm.py no longer imports the registries for its help texts: they must not drift."""
    from grpo_lightning.algorithm import ADVANTAGE_SCALES, IS_LEVELS, KL_ESTIMATORS  # noqa: PLC0415
    from grpo_lightning.algorithm.corrections import CORRECTION_MODES  # noqa: PLC0415
    from grpo_lightning.algorithm.lr_schedule import LR_SCHEDULES  # noqa: PLC0415
    from grpo_lightning.algorithm.truncation import TRUNCATED_SAMPLING  # noqa: PLC0415
    from grpo_lightning.config import AlgorithmConfig, field_help  # noqa: PLC0415

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
