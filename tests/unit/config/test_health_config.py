"""HealthConfig: help text on every field, validation names the field, Hydra composes it."""

from __future__ import annotations

from dataclasses import asdict, fields, is_dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grpo_lightning.config import HEALTH_CHECKS, ConfigError, HealthConfig, TrainConfig, validate_config
from grpo_lightning.config.compose import plan
from grpo_lightning.config.nodes import with_plugin_nodes
from grpo_lightning.train import CONF_DIR, to_train_config  # noqa: F401 (registers the schema)


def _all_fields(cls):
    for f in fields(cls):
        yield cls, f
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            yield from _all_fields(type(default))


def test_every_health_field_has_help_text():
    """Every check's node (health.<check>, built from the registry) and every field in it."""
    schema = with_plugin_nodes(HealthConfig)
    assert set(HEALTH_CHECKS) <= {f.name for f in fields(schema)}
    missing = [f"{cls.__name__}.{f.name}" for cls, f in _all_fields(schema) if not f.metadata.get("help")]
    assert missing == []


def test_invalid_health_values_are_named():
    cfg = TrainConfig()
    cfg.health.diversity.action = "shout"
    cfg.health.no_update.patience = 0
    with pytest.raises(ConfigError) as caught:
        validate_config(cfg)
    assert "health.diversity.action='shout'" in str(caught.value)
    assert "health.no_update.patience=0" in str(caught.value)


def test_hydra_composes_the_health_group_with_the_dataclass_defaults():
    # Phase 1 (plan) stores the schema with a node per registered check; Hydra composes onto it.
    steps = plan(["health.degenerate.action=raise", "trainer.output_dir=out"])
    with initialize_config_dir(config_dir=str(Path(CONF_DIR)), version_base="1.3"):
        cfg = compose(config_name="train", overrides=steps.hydra)
    train = to_train_config(cfg)
    assert train.health.degenerate.action == "raise"
    expected = asdict(with_plugin_nodes(HealthConfig)())
    expected["degenerate"]["action"] = "raise"
    assert asdict(train.health) == expected
    assert set(HEALTH_CHECKS) <= set(OmegaConf.to_container(cfg.health))
