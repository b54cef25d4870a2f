"""Configs: help text everywhere; invalid values rejected before any model loads, field named."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grpo_lightning import build
from grpo_lightning.config import ConfigError, TrainConfig, validate_config
from grpo_lightning.config.compose import schema
from grpo_lightning.train import _SCHEMA, CONF_DIR  # importing train registers the schema

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


def test_composed_default_config_is_valid_and_equals_the_dataclass_defaults():
    cfg = compose_config()
    validate_config(cfg)
    cfg.trainer.output_dir = TrainConfig().trainer.output_dir  # the CLI's run folder
    assert cfg == TrainConfig()
    assert compose_config("algorithm=dr_grpo").algorithm.advantage_scale == "none"


def test_the_dapo_preset_composes_every_dapo_setting_onto_any_task():
    cfg = compose_config("+preset=dapo", "task=reasoning_gym")
    validate_config(cfg)
    a = cfg.algorithm
    assert (a.beta, a.loss_agg, a.clip_high, a.mask_truncated) == (0.0, "token_mean", 0.28, True)
    assert cfg.rollout.dynamic_sampling
    assert cfg.task.rewards["overlong_penalty"] == 1.0 and cfg.task.rewards["reasoning_gym"] == 1.0


GROUP_OPTIONS = sorted(p.relative_to(CONF_DIR).with_suffix("").as_posix() for p in CONF_DIR.glob("*/*.yaml"))


def repeated_values(option: dict, base: dict, prefix: str):
    """Keys of ``option`` whose value equals what it is merged onto (dicts merge key-wise, so recurse;
    an empty dict merges as nothing)."""
    for key, value in option.items():
        if key not in base:
            continue
        if isinstance(value, dict) and isinstance(base[key], dict) and value:
            yield from repeated_values(value, base[key], f"{prefix}.{key}")
        elif value == base[key]:
            yield f"{prefix}.{key}={value!r}"


def _is_task_schema(entry) -> bool:
    """A task file's first default: its task's registered options (the schema it starts from)."""
    return isinstance(entry, dict) and list(entry) == ["/task_schema@_here_"]


@pytest.mark.parametrize("option", GROUP_OPTIONS)
def test_a_group_option_holds_only_what_differs_from_the_defaults(option):
    """One source of truth: defaults live in grpo_lightning/config/, never repeated in a YAML file.

    An option is merged onto the schema (the dataclass defaults), or onto the options of its own
    group that its defaults list names first (dapo.yaml starts from grpo.yaml).
    """
    assert len(GROUP_OPTIONS) >= 15
    group = option.split("/")[0]
    path = CONF_DIR / f"{option}.yaml"
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if path.read_text().startswith("# @package _global_"):
        # A preset spanning groups (+preset=dapo): each group it sets is merged onto the
        # default config with the group options its defaults list overrides.
        overrides = [
            f"{k.removeprefix('override /')}={v}"
            for d in raw.pop("defaults", [])
            if d != "_self_"
            for k, v in d.items()
        ]
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            base = OmegaConf.to_container(compose("train", overrides=overrides), resolve=False)
        repeated = [r for key, value in raw.items() for r in repeated_values(value, base[key], key)]
        assert not repeated, f"{option}.yaml repeats what it is merged onto: {repeated}"
        return
    parents = [d for d in raw.pop("defaults", []) if d != "_self_" and not _is_task_schema(d)]
    assert len(parents) <= 1, parents
    if parents:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            base = compose("train", overrides=[f"{group}={parents[0]}"])[group]
    else:
        base = OmegaConf.structured(schema(option.split("/")[1]) if group == "task" else _SCHEMA)[group]
    repeated = list(repeated_values(raw, OmegaConf.to_container(base, resolve=False), group))
    assert not repeated, f"{option}.yaml repeats defaults of grpo_lightning/config/: {repeated}"


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
