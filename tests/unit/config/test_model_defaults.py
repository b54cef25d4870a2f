"""A model brings its own defaults (lr, completion budget) in place of the tiny model's, unless
the user, a preset or Python set the value; the run lists what differs from the defaults."""

from __future__ import annotations

import pytest

from grpo_lightning.config import ConfigError, TrainConfig
from grpo_lightning.config.compose import compose
from grpo_lightning.config.effective import apply_model_defaults, differences
from grpo_lightning.config.model import MODEL_DEFAULTS, model_defaults

OUT = "trainer.output_dir=/tmp/unused"
TINY_LR, TINY_TOKENS = TrainConfig().algorithm.lr, TrainConfig().rollout.max_new_tokens


def _lr_tokens(cfg):
    return cfg.algorithm.lr, cfg.rollout.max_new_tokens


def test_choosing_smollm2_brings_its_lr_and_budget():
    cfg, composed = compose([OUT, "model=smollm2_135m"])
    expected = MODEL_DEFAULTS["smollm2_135m"]
    assert _lr_tokens(cfg) == (expected["algorithm.lr"], expected["rollout.max_new_tokens"])
    assert composed.algorithm.lr == expected["algorithm.lr"]  # what the logger records agrees


@pytest.mark.parametrize("model", [[], ["model.name_or_path=/some/folder"]])
def test_the_tiny_model_and_unknown_models_keep_the_group_defaults(model):
    assert _lr_tokens(compose([OUT, *model])[0]) == (TINY_LR, TINY_TOKENS)


@pytest.mark.parametrize("override", ["algorithm.lr=3e-4", "learning_rate=3e-4"])
def test_a_value_on_the_command_line_wins_even_when_it_equals_the_group_default(override):
    cfg = compose([OUT, "model=smollm2_135m", override])[0]
    assert cfg.algorithm.lr == TINY_LR
    apply_model_defaults(cfg)  # build_run applies them again for Python configs: a no-op here
    assert cfg.algorithm.lr == TINY_LR


def test_a_preset_wins_over_the_model_defaults():
    cfg = compose([OUT, "+preset=smollm2_reasoning_gym", "task.dataset=chain_sum"])[0]
    assert cfg.rollout.max_new_tokens == 16 and cfg.algorithm.lr == 2e-5


def test_python_configs_get_them_once_and_keep_what_was_set():
    cfg = TrainConfig()
    cfg.model.name_or_path = "smollm2_135m"
    cfg.rollout.max_new_tokens = 32
    assert apply_model_defaults(cfg) == {"algorithm.lr": model_defaults("smollm2_135m")["algorithm.lr"]}
    assert cfg.rollout.max_new_tokens == 32
    cfg.algorithm.lr = TINY_LR
    assert apply_model_defaults(cfg) == {} and cfg.algorithm.lr == TINY_LR


def test_differences_list_the_effective_values_and_mark_the_models():
    cfg = compose([OUT, "model=smollm2_135m", "trainer.max_steps=20"])[0]
    lines = differences(cfg)
    assert "algorithm.lr=2e-05  (smollm2_135m's default)" in lines
    assert "trainer.max_steps=20" in lines
    assert not any(line.startswith("algorithm.beta") for line in lines)


@pytest.mark.parametrize("model", ["tiny", "smollm2_135m"])
@pytest.mark.parametrize("task", ["guess_number", "key_lookup"])
def test_a_task_brings_its_defaults_for_the_model_before_the_models_own(task, model):
    cfg, composed = compose([OUT, f"task={task}", f"model={model}"])
    brought = cfg.task.model_defaults[model]
    for key, value in brought.items():
        group, leaf = key.split(".")
        assert getattr(getattr(cfg, group), leaf) == value, key
        assert composed[group][leaf] == value  # what the logger records agrees
    lines = differences(cfg)
    key, value = next(iter(brought.items()))
    assert f"{key}={value!r}  (task={task}'s default for {model})" in lines
    if model == "smollm2_135m":  # the model's own default where the task brings none
        assert f"algorithm.lr={MODEL_DEFAULTS[model]['algorithm.lr']}  ({model}'s default)" in lines


def test_a_task_default_gives_way_to_the_command_line_and_names_a_wrong_key():
    cfg = compose([OUT, "task=key_lookup", "rollout.max_new_tokens=5", "task.key_style=words"])[0]
    assert cfg.rollout.max_new_tokens == 5 and cfg.task.key_style == "words" and cfg.task.question == "{key}?"
    python = TrainConfig()
    python.task.model_defaults = {"tiny": {"rollout.max_new_tokenz": 3}}
    with pytest.raises(ConfigError, match="names rollout.max_new_tokenz, which is not a config field"):
        apply_model_defaults(python)
