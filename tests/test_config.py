"""Configs: help text everywhere; invalid values rejected before any model loads, field named."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grpo_lightning import build
from grpo_lightning.config import ConfigError, TrainConfig, validate_config
from grpo_lightning.train import CONF_DIR  # importing train registers the schema

CONF = str(CONF_DIR)


def compose_config(*overrides) -> TrainConfig:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=["trainer.output_dir=/tmp/unused", *overrides])
    return OmegaConf.to_object(cfg)


def test_every_config_field_has_help_text():
    def walk(cls, prefix=""):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{prefix}{f.name} has no help text"
            if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
                walk(f.type, f"{prefix}{f.name}.")
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(default):
                walk(type(default), f"{prefix}{f.name}.")

    walk(TrainConfig)


def test_composed_default_config_is_valid_and_matches_the_schema_defaults():
    cfg = compose_config()
    validate_config(cfg)
    assert cfg.algorithm.loss_agg == TrainConfig().algorithm.loss_agg
    assert compose_config("algorithm=dr_grpo").algorithm.advantage_scale == "none"


@pytest.mark.parametrize(
    "override, field, allowed",
    [
        ("algorithm.beta=-0.1", "algorithm.beta", ">= 0"),
        ("rollout.num_generations=1", "rollout.num_generations", ">= 2"),
        ("algorithm.micro_batch_size=7", "algorithm.micro_batch_size", "must divide"),
        ("algorithm.loss_agg=mean", "algorithm.loss_agg", "seq_mean_token_mean"),
        ("algorithm.kl_estimator=k4", "algorithm.kl_estimator", "k3"),
        ("+task.rewards.accuracy=1.0", "task.rewards.accuracy", "arithmetic_exact"),
    ],
)
def test_invalid_values_name_the_field_and_what_is_allowed(override, field, allowed, monkeypatch):
    loaded = []
    monkeypatch.setattr(build, "load_policy", lambda *a: loaded.append(a))
    cfg = compose_config(override)
    with pytest.raises(ConfigError) as info:
        build.build_run(cfg)
    assert field in str(info.value) and allowed in str(info.value)
    assert loaded == []  # rejected before any model loads
