"""The vLLM / async / importance-sampling config fields: documented, validated, composable."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from grpo_lightning.config import (
    AlgorithmConfig,
    ConfigError,
    RolloutConfig,
    TrainConfig,
    VLLMConfig,
    field_help,
    validate_config,
)
from grpo_lightning.train import CONF_DIR, to_train_config


def test_every_new_field_has_help_text():
    for cls, names in (
        (RolloutConfig, ["mode", "max_staleness", "vllm"]),
        (AlgorithmConfig, ["is_level", "is_cap"]),
        (VLLMConfig, list(field_help(VLLMConfig))),
    ):
        help_text = field_help(cls)
        assert all(help_text[n] for n in names), cls


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: setattr(c.rollout, "mode", "async"), "needs rollout.engine=vllm"),
        (lambda c: setattr(c.rollout, "mode", "later"), "rollout.mode"),
        (lambda c: setattr(c.algorithm, "is_level", "tokens"), "algorithm.is_level"),
        (lambda c: setattr(c.algorithm, "is_cap", 0.0), "algorithm.is_cap"),
        (lambda c: setattr(c.rollout.vllm, "sync_every", 0), "rollout.vllm.sync_every"),
        (lambda c: setattr(c.rollout, "max_staleness", 0), "rollout.max_staleness"),
        (
            lambda c: (
                setattr(c.rollout, "engine", "vllm"),
                setattr(c.rollout, "mode", "async"),
                setattr(c.trainer, "devices", 2),
            ),
            "needs one vLLM server shared by the ranks",
        ),
        (lambda c: setattr(c.rollout.vllm.server, "timeout_s", 0.0), "rollout.vllm.server.timeout_s"),
        (lambda c: setattr(c.rollout.vllm.server, "concurrency", 0), "rollout.vllm.server.concurrency"),
    ],
)
def test_invalid_values_are_rejected_by_name(change, message):
    cfg = TrainConfig()
    change(cfg)
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg)


def test_rollout_vllm_group_composes_and_validates():
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "rollout=vllm",
                "rollout.mode=async",
                "algorithm.is_level=token",
                "logger=none",
                "trainer.output_dir=/tmp/x",
            ],
        )
    train_cfg = to_train_config(cfg)
    validate_config(train_cfg)
    assert train_cfg.rollout.engine == "vllm" and train_cfg.rollout.mode == "async"
    assert train_cfg.rollout.vllm.sync_every == 1
