"""The merged LoRA export writes each merged weight over its unmerged bytes, one at a time: the
folder must hold exactly the merged weights, whatever the dtype, sharding or tied weights, and
a folder it cannot patch is left untouched for the whole-dict fallback."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import grpo_lightning.models.lora as lora
from grpo_lightning.config import LoraModelConfig, ModelConfig
from grpo_lightning.models import load_policy
from grpo_lightning.models.lora import apply_lora, merged_state_dict, save_merged
from grpo_lightning.models.weight_files import INDEX, overwrite_tensors, tensor_places


def folder_weights(folder):
    weights = {}
    for path in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(path))
    return weights


def random_lora_policy(seed: int, dtype: torch.dtype, tied: bool, targets: list[str]):
    generator = torch.Generator().manual_seed(seed)
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)
    policy = apply_lora(
        model,
        LoraModelConfig(rank=int(torch.randint(1, 5, (1,), generator=generator)), alpha=8.0, target_modules=targets),
    )
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    return policy


@pytest.mark.parametrize("seed", range(8))
def test_the_written_folder_holds_exactly_the_merged_weights(tmp_path, seed):
    dtype = [torch.float32, torch.bfloat16, torch.float16][seed % 3]
    targets = [
        ["q_proj", "v_proj"],
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ["down_proj"],
    ][seed % 3]
    policy = random_lora_policy(seed, dtype, tied=seed % 2 == 0, targets=targets)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    save_merged(policy, tmp_path)
    written = folder_weights(tmp_path)
    expected = merged_state_dict(policy)
    unmerged = {n.replace(".base_layer.", "."): t for n, t in policy.get_base_model().state_dict().items()}
    changed = {n for n in expected if not torch.equal(expected[n], unmerged[n])}
    assert changed == {n for n in expected if any(f".{t}." in n for t in targets)}  # exactly the adapted ones
    for name, tensor in written.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name
    assert set(expected) - set(written) <= ({"lm_head.weight"} if seed % 2 == 0 else set())
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())  # the policy untouched
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype).state_dict()  # as a user loads it
    assert reloaded.keys() == expected.keys()
    assert all(torch.equal(reloaded[n], expected[n]) for n in expected)
    if seed % 2 == 0:  # tied: the head is the merged embedding, as in the policy
        assert torch.equal(reloaded["lm_head.weight"], expected["model.embed_tokens.weight"])


def test_sharded_folders_are_patched_in_their_own_shard(tmp_path):
    policy = random_lora_policy(3, torch.float32, tied=False, targets=["gate_proj", "up_proj", "down_proj"])
    base = policy.get_base_model()
    plain = {n.replace(".base_layer.", "."): t for n, t in base.state_dict().items() if ".lora_" not in n}
    base.save_pretrained(tmp_path, state_dict=dict(plain), max_shard_size="4KB")  # it empties the dict it is given
    assert (tmp_path / INDEX).is_file() and len(list(tmp_path.glob("*.safetensors"))) > 2
    expected = merged_state_dict(policy)
    names = [n for n in expected if "mlp" in n]
    places = tensor_places(tmp_path)
    assert len({places[n][0] for n in names}) > 1  # the patched weights sit in several shards
    assert overwrite_tensors(tmp_path, {n: (plain[n], lambda n=n: expected[n].clone()) for n in names})
    written = folder_weights(tmp_path)
    assert all(torch.equal(written[n], expected[n]) for n in expected)


def test_one_merged_weight_is_alive_at_a_time(tmp_path):
    policy, _ = load_policy(ModelConfig(lora=LoraModelConfig(rank=4, alpha=8.0)))
    base = policy.get_base_model()
    plain = {n.replace(".base_layer.", "."): t for n, t in base.state_dict().items() if ".lora_" not in n}
    base.save_pretrained(tmp_path, state_dict=dict(plain))
    made: list[weakref.ref] = []

    def make(name):
        gc.collect()
        assert all(ref() is None for ref in made), "an earlier merged weight is still alive"
        tensor = plain[name] + 1.0
        made.append(weakref.ref(tensor))
        return tensor

    names = [n for n in plain if "proj" in n]
    assert overwrite_tensors(tmp_path, {n: (plain[n], lambda n=n: make(n)) for n in names})
    assert len(made) == len(names)
    written = folder_weights(tmp_path)
    assert all(torch.equal(written[n], plain[n] + 1.0) for n in names)


@pytest.mark.parametrize("wrong", ["missing", "shape", "dtype"])
def test_a_folder_it_cannot_patch_is_left_untouched(tmp_path, wrong):
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=8,
            intermediate_size=12,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    model.save_pretrained(tmp_path)
    files = {p: p.read_bytes() for p in tmp_path.glob("*.safetensors")}
    weight = model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    name, written = {
        "missing": ("model.layers.0.mlp.up_proj.renamed", weight),
        "shape": ("model.layers.0.mlp.up_proj.weight", weight.T.contiguous()),
        "dtype": ("model.layers.0.mlp.up_proj.weight", weight.to(torch.bfloat16)),
    }[wrong]
    called = []
    ok = overwrite_tensors(
        tmp_path,
        {
            "model.layers.0.mlp.down_proj.weight": (
                model.state_dict()["model.layers.0.mlp.down_proj.weight"],
                lambda: called.append(1),
            ),
            name: (written, lambda: called.append(1)),
        },
    )
    assert not ok and not called
    assert all(p.read_bytes() == data for p, data in files.items())


def test_save_merged_falls_back_to_the_whole_dict_when_it_cannot_patch(tmp_path, monkeypatch):
    policy = random_lora_policy(5, torch.float32, tied=False, targets=["q_proj", "v_proj"])
    monkeypatch.setattr(lora, "overwrite_tensors", lambda folder, tensors: False)
    save_merged(policy, tmp_path)
    expected = merged_state_dict(policy)
    written = folder_weights(tmp_path)
    assert written.keys() == expected.keys() and all(torch.equal(written[n], expected[n]) for n in expected)
