"""Adapter-only sync: a LoRA policy ships its adapter (not merged weights), each version under a
name of its own that generations then use, at most ``slots`` loaded; a PEFT config with
``modules_to_save`` is refused; a failed canary leaves generations on the previous adapter."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers.fake_server_engine import FakeServers, held
from safetensors.torch import load_file

from grpo_lightning.config import LoraModelConfig
from grpo_lightning.errors import ConfigError
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.models.adapter_sync import adapter_weights, base_state
from grpo_lightning.models.lora import apply_lora, merged_state_dict
from grpo_lightning.rollout.lora_adapters import LoraServing
from grpo_lightning.rollout.weight_sync import ProbeScores, WeightSync, WeightSyncError
from grpo_lightning.step.weight_push import policy_weights


@pytest.fixture(scope="module")
def lora_policy():
    return apply_lora(build_tiny_policy(build_char_tokenizer()), LoraModelConfig(rank=4))


def _bytes(weights) -> int:
    return sum(t.numel() * t.element_size() for _, t in weights.tensors)


def test_adapter_weights_are_the_adapters_only_under_peft_names(lora_policy):
    adapter, merged = policy_weights(lora_policy, 3, adapter=True), policy_weights(lora_policy, 3)
    names = [name for name, _ in adapter.tensors]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert all(n.startswith("base_model.model.") for n in names)
    assert adapter.adapter_config["r"] == 4 and adapter.adapter_config["peft_type"] == "LORA"
    json.dumps(adapter.adapter_config)  # adapter_config.json content
    assert merged.adapter_config is None and _bytes(adapter) < _bytes(merged) / 4


def test_modules_to_save_are_refused_naming_the_fix():
    policy = build_tiny_policy(build_char_tokenizer())
    policy = apply_lora(policy, LoraModelConfig(rank=4))
    policy.peft_config[policy.active_adapter].modules_to_save = ["lm_head"]
    with pytest.raises(ConfigError, match="rollout.vllm.sync.adapter=merged"):
        adapter_weights(policy)


def test_launch_arguments_round_the_rank_up_to_one_vllm_accepts():
    assert LoraServing(4, 3).server_args() == [
        "--enable-lora", "--max-lora-rank", "8", "--max-loras", "3", "--max-cpu-loras", "3"
    ]  # fmt: skip
    assert LoraServing(16, 2).server_args()[2] == "16"
    with pytest.raises(ValueError, match="largest"):
        LoraServing(1024, 2).server_args()


def _canary(logprob: float) -> ProbeScores:
    prompt, completion = WeightSync.probe_ids()
    return ProbeScores(prompt, completion, torch.full((len(completion),), logprob))


def test_each_sync_loads_a_new_adapter_keeps_slots_and_a_bad_canary_keeps_the_last(tmp_path, lora_policy):
    servers = FakeServers(tmp_path)
    try:
        engine, _ = servers.start(lora=LoraServing(4, 2))
        sync = WeightSync(verify=True)
        assert engine.takes_adapters
        folders = []
        for version in (1, 2, 3):
            sync.sync(policy_weights(lora_policy, version, adapter=True), engine, _canary(-1.0))
            folders.append(os.path.join(engine.sync_folder(), f"adapter-v{version}"))
        state = held(engine)
        assert state["adapters"] == ["policy-lora-v2", "policy-lora-v3"] and state["weight_version"] == "3"
        assert engine.client.model == "policy-lora-v3" and state["reloads"] == 0  # no base-weight reload
        assert not os.path.exists(folders[0])  # unloaded with its adapter
        saved = load_file(os.path.join(folders[2], "adapter_model.safetensors"))
        assert set(saved) == {name for name, _ in policy_weights(lora_policy, 3, adapter=True).tensors}
        with pytest.raises(WeightSyncError):
            sync.sync(policy_weights(lora_policy, 4, adapter=True), engine, _canary(-2.0))
        assert engine.client.model == "policy-lora-v3" and held(engine)["weight_version"] == "3"
    finally:
        servers.close()


def test_a_server_taking_adapters_starts_from_the_base_weights_whatever_the_adapters_learnt():
    lora_policy = apply_lora(build_tiny_policy(build_char_tokenizer()), LoraModelConfig(rank=4))
    with torch.no_grad():
        for name, param in lora_policy.named_parameters():
            if "lora_B" in name:
                param.fill_(0.1)  # trained adapters (a resumed run)
    base = lora_policy.get_base_model()
    merged = merged_state_dict(lora_policy, base_state(lora_policy))
    changed = merged_state_dict(lora_policy)
    key = next(k for k in merged if k.endswith("q_proj.weight"))
    assert torch.equal(merged[key], base.get_submodule(key.removesuffix(".weight")).base_layer.weight)
    assert not torch.equal(changed[key], merged[key])
