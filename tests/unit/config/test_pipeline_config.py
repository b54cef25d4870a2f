"""rollout.mode=pipeline: the combinations it does not serve are refused before any model loads, each in
one line naming the option and what to use instead."""

from __future__ import annotations

import pytest
from conftest import make_config

import grpo_lightning.rollout.pipeline  # noqa: F401  (registers the pipeline's cross-group config check)
from grpo_lightning.config import ConfigError, validate_config

REFUSED = {
    "vllm": ({"rollout.engine": "vllm"}, "rollout.mode=pipeline with rollout.engine=vllm needs a vLLM server"),
    "lora": (
        {"rollout.engine": "vllm", "rollout.vllm.server.launch": True, "model.lora.rank": 4},
        "does not sync LoRA adapters alone",
    ),
    "loop": ({"rollout.hf_decoder": "loop"}, "rollout.hf_decoder=loop: sequences join and leave"),
    "lag": ({"rollout.pipeline.max_lag": 9}, "rollout.pipeline.max_lag=9 exceeds rollout.max_off_policy_steps=8"),
    "negative": ({"rollout.pipeline.max_in_flight": -1}, "rollout.pipeline.max_in_flight=-1 must be >= 0"),
    "fsdp": ({"trainer.strategy": "fsdp"}, "rollout.mode=pipeline with trainer.strategy=fsdp"),
    "vision": ({"model.name_or_path": "tiny_vlm"}, "rollout.mode=pipeline with a vision-language policy"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unserved_combinations_are_refused_in_one_line(case):
    overrides, message = REFUSED[case]
    with pytest.raises(ConfigError) as refused:
        validate_config(make_config(2, **{"rollout.mode": "pipeline", **overrides}))
    lines = [line for line in str(refused.value).splitlines() if message in line]
    assert len(lines) == 1, str(refused.value)


def test_the_default_pipeline_config_is_valid_and_dynamic_sampling_is_allowed():
    validate_config(make_config(2, **{"rollout.mode": "pipeline", "rollout.dynamic_sampling": True}))
    server = {"rollout.engine": "vllm", "rollout.vllm.server.launch": True}  # a vLLM server serves the mode
    validate_config(make_config(2, **{"rollout.mode": "pipeline", **server}))
    with pytest.raises(ConfigError, match="dynamic_sampling=true needs rollout.mode=sync or pipeline"):
        validate_config(make_config(2, **{"rollout.mode": "async", "rollout.dynamic_sampling": True}))


def test_episodes_are_refused_naming_the_environment():
    from grpo_lightning.config.compose import compose  # noqa: PLC0415  (Hydra: only this test)

    cfg, _ = compose(["trainer.output_dir=/tmp/unused", "task=guess_number", "rollout.mode=pipeline"])
    with pytest.raises(ConfigError, match=r"rollout.mode=pipeline does not play episodes \(task.environment\) yet"):
        validate_config(cfg)
