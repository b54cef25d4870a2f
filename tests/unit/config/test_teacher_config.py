"""``algorithm.teacher.*`` (config/teacher.py): off by default, its nodes on the command line, and the
combinations refused with their reason before anything loads."""

from __future__ import annotations

import re

import pytest
from conftest import make_config

from grpo_lightning.config import TrainConfig, validate_config
from grpo_lightning.config.compose import compose
from grpo_lightning.config.early import early_check
from grpo_lightning.errors import ConfigError


def problems(*overrides: str) -> str:
    """What composing and validating ``overrides`` refuses (an unknown key is refused by the first)."""
    with pytest.raises(ConfigError) as err:
        validate_config(compose([*overrides, "trainer.output_dir=out"])[0])
    return str(err.value)


def test_no_teacher_by_default():
    cfg = TrainConfig()
    assert not cfg.algorithm.teacher.active and cfg.algorithm.teacher.resolved_kind() == "none"
    validate_config(cfg)


def test_a_path_alone_is_a_folder_teacher(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = make_config(1, **{"algorithm.teacher.path": str(tmp_path)})
    assert cfg.algorithm.teacher.resolved_kind() == "folder" and cfg.algorithm.teacher.active
    validate_config(cfg)


def test_a_missing_teacher_folder_is_named_early():
    with pytest.raises(ConfigError, match=r"algorithm.teacher.path='/no/such/teacher': no such folder"):
        early_check(["algorithm.teacher.path=/no/such/teacher"])


@pytest.mark.slow
def test_nodes_of_objectives_and_kinds_compose_and_are_checked_by_name():
    cfg = compose(["algorithm.teacher.kind=context", "algorithm.teacher.jsd.beta=0.25", "trainer.output_dir=o"])[0]
    assert cfg.algorithm.teacher.jsd.beta == 0.25
    early_check(["algorithm.teacher.jsd.beta=0.25"])  # a node's key is left to the full composition
    assert "did you mean algorithm.teacher.jsd.beta" in problems("algorithm.teacher.jsd.bta=0.2")
    assert "algorithm.teacher.jsd.beta=2.0 must be in [0, 1]" in problems("algorithm.teacher.jsd.beta=2")
    assert "did you mean 'jsd'" in problems("algorithm.teacher.kind=context", "algorithm.teacher.objective=jds")


PURE = {"task.rewards": {"arithmetic_exact": 0.0, "arithmetic_close": 0.0}}
SERVER = {"algorithm.teacher.kind": "server", "algorithm.teacher.server.url": "http://h:1"}
CONTEXT = {"algorithm.teacher.kind": "context"}


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {**SERVER, "algorithm.teacher.objective": "jsd"},
            "a vLLM server returns the log-probs of the sampled tokens only",
        ),
        ({"algorithm.teacher.kind": "server"}, "needs algorithm.teacher.server.url"),
        ({**SERVER, "rollout.temperature": 0.7}, "set rollout.temperature=1.0"),
        ({**CONTEXT, **PURE, "rollout.dynamic_sampling": True}, "dynamic sampling would drop every group"),
        ({**CONTEXT, **PURE, "algorithm.teacher.weight": 0.0}, "nothing to learn from"),
        ({"algorithm.teacher.kind": "base"}, "model.lora is off"),
        ({"algorithm.teacher.kind": "folder"}, "needs algorithm.teacher.path"),
        ({**CONTEXT, "algorithm.teacher.context.prefix_file": "/no/file"}, "no such file"),
        ({**CONTEXT, "algorithm.teacher.device": "cpu"}, "applies to a teacher folder only"),
    ],
)
def test_refused_combinations_say_why(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        validate_config(make_config(1, **overrides))


def test_distillation_beside_rewards_may_keep_dynamic_sampling():
    validate_config(make_config(1, **CONTEXT, **{"rollout.dynamic_sampling": True}))
