"""model.dtype x trainer.precision, LoRA fields and the strategy: invalid combinations are
rejected before any model loads, naming the fields and the usual choices."""

from __future__ import annotations

import pytest
import torch
from conftest import make_config

from grpo_lightning.config import ConfigError, ModelConfig, validate_config
from grpo_lightning.models import load_policy


@pytest.mark.parametrize(
    "overrides, named",
    [
        (
            {"model.dtype": "bfloat16", "trainer.precision": "bf16-mixed"},
            ["model.dtype=bfloat16", "trainer.precision=bf16-mixed", "bf16-mixed (float32 weights"],
        ),
        (
            {"model.dtype": "float16", "trainer.precision": "16-mixed"},
            ["model.dtype=float16", "trainer.precision=16-mixed"],
        ),
        (
            {"model.dtype": "float32", "trainer.precision": "bf16-true"},
            ["trainer.precision=bf16-true", "set model.dtype=bfloat16"],
        ),
        ({"model.dtype": "float64"}, ["model.dtype='float64'", "'auto'"]),
        ({"model.lora.rank": -1}, ["model.lora.rank=-1"]),
        ({"model.lora.dropout": 1.0}, ["model.lora.dropout=1.0"]),
        (
            {"model.lora.rank": 8, "model.lora.config_file": "x.json"},
            ["model.lora.config_file='x.json'", "model.lora.rank=8"],
        ),
        ({"trainer.strategy": "horovod"}, ["trainer.strategy='horovod'", "'fsdp'"]),
        ({"trainer.num_nodes": 0}, ["trainer.num_nodes=0"]),
        ({"trainer.strategy": "deepspeed"}, ["trainer.strategy=deepspeed is not supported", "trainer.strategy=fsdp"]),
        (
            {"trainer.strategy": "fsdp", "trainer.checkpoint_every_n_steps": 5},
            ["trainer.strategy=fsdp does not write or resume checkpoints", "trainer.checkpoint_every_n_steps=5"],
        ),
        (
            {"trainer.strategy": "fsdp", "rollout.engine": "vllm"},
            ["trainer.strategy=fsdp needs rollout.engine=hf", "trainer.strategy=ddp"],
        ),
    ],
)
def test_invalid_combinations_name_the_fields(overrides, named):
    with pytest.raises(ConfigError) as err:
        validate_config(make_config(1, **overrides))
    for text in named:
        assert text in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"model.dtype": "float32", "trainer.precision": "bf16-mixed"},
        {"model.dtype": "bfloat16", "trainer.precision": "32-true"},
        {"model.dtype": "bfloat16", "trainer.precision": "bf16-true", "model.lora.rank": 16},
        {"model.dtype": "auto"},
    ],
)
def test_the_usual_choices_are_valid(overrides):
    validate_config(make_config(1, **overrides))


@pytest.mark.parametrize(
    "dtype, expected", [("bfloat16", torch.bfloat16), ("float16", torch.float16), ("auto", torch.float32)]
)
def test_weights_load_in_model_dtype(dtype, expected):
    policy, _ = load_policy(ModelConfig(dtype=dtype))
    assert {p.dtype for p in policy.parameters()} == {expected}
