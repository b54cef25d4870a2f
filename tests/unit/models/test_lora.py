"""LoRA through peft: the reference is the base model (no copy), gradients accumulate exactly,
the F4 check measures what trains, and merged weights (engine sync, export) equal the policy."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import fit, gradients, make_config
from peft import PeftModel
from transformers import AutoModelForCausalLM

import grpo_lightning.models.forward as forward
from grpo_lightning.config import AlgorithmConfig, LoraModelConfig, ModelConfig
from grpo_lightning.config.algorithm import AUTO_LOGPROB_CHUNK_MB
from grpo_lightning.models import load_policy
from grpo_lightning.models.lora import AdapterDisabledReference, merged_state_dict, save_adapter, save_merged
from grpo_lightning.step.module import GRPOModule


def lora_policy(rank: int = 8, **model):
    """The tiny policy with LoRA adapters whose B is non-zero (peft starts it at 0: no effect yet)."""
    policy, tokenizer = load_policy(ModelConfig(lora=LoraModelConfig(rank=rank, alpha=16.0), **model))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    return policy, tokenizer


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[3, 5, 7, 9, 4, 6, 8, 10]])


def test_only_the_adapters_train_on_every_projection():
    policy, _ = lora_policy()
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # the default targets: every attention and MLP projection of the architecture, not the head
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    only_qv, _ = load_policy(ModelConfig(lora=LoraModelConfig(rank=4, target_modules=["q_proj", "v_proj"])))
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in only_qv.named_parameters() if p.requires_grad} == {
        "q_proj",
        "v_proj",
    }


def test_reference_log_probs_equal_the_untouched_base_models(rollout):
    base, _ = load_policy(ModelConfig())  # the same seed: the weights LoRA was put on
    policy, _ = lora_policy()
    module = GRPOModule(policy, AlgorithmConfig(beta=0.1, micro_batch_size=4))
    assert isinstance(module.reference, AdapterDisabledReference)
    # no second copy of the weights: the module holds the base weights once, plus the adapters
    adapters = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert sum(p.numel() for p in module.parameters()) == sum(p.numel() for p in base.parameters()) + adapters
    module.train()
    prepared = module.prepare(rollout)
    expected = GRPOModule(base, AlgorithmConfig(beta=0.0, micro_batch_size=4))._frozen_log_probs(
        base.eval(), rollout, prepared.micro_batches
    )
    mask = rollout.completion_mask.bool()
    assert torch.allclose(prepared.reference.logp[mask], expected.logp[mask], atol=1e-6)
    # ... while the policy (adapters on) scores differently, and is back in train mode with adapters on
    policy_logp = module._frozen_log_probs(policy, rollout, prepared.micro_batches).logp
    assert (policy_logp[mask] - expected.logp[mask]).abs().max() > 1e-3
    assert policy.training


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum_norm"])
def test_one_micro_batch_of_16_equals_16_of_one_with_adapters(rollout, mode):
    policy, _ = lora_policy()
    whole, _ = gradients(policy, rollout, micro_batch_size=16, loss_agg=mode, beta=0.1)
    split, _ = gradients(policy, rollout, micro_batch_size=1, loss_agg=mode, beta=0.1)
    assert whole.keys() == split.keys() and all(".lora_" in name for name in whole)
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == whole.keys()  # A and B both get one
    for name in whole:
        scale = whole[name].abs().max().clamp(min=1e-8)
        assert (whole[name] - split[name]).abs().max() / scale < 1e-5, name


def test_merged_weights_are_the_policys_and_leave_it_untouched():
    policy, _ = lora_policy()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    merged = merged_state_dict(policy)
    plain, _ = load_policy(ModelConfig())
    assert merged.keys() == plain.state_dict().keys()  # plain Hugging Face names
    plain.load_state_dict(merged)
    assert torch.allclose(logits(plain, IDS), logits(policy, IDS), atol=1e-5)
    assert not torch.allclose(logits(plain, IDS), logits(load_policy(ModelConfig())[0], IDS), atol=1e-3)
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())


def test_adapter_folder_and_merged_folder_load_without_our_code(tmp_path):
    policy, tokenizer = lora_policy()
    save_adapter(policy, tmp_path / "adapter")
    save_merged(policy, tmp_path / "merged", tokenizer)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not list((tmp_path / "merged").glob("adapter_*"))
    expected = logits(policy, IDS)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(logits(merged, IDS), expected, atol=1e-5)
    reloaded = PeftModel.from_pretrained(load_policy(ModelConfig())[0], tmp_path / "adapter")
    assert torch.allclose(logits(reloaded, IDS), expected, atol=1e-6)


def test_lora_config_file_is_used(tmp_path):
    policy, _ = load_policy(ModelConfig(lora=LoraModelConfig(rank=4, alpha=8.0, target_modules=["v_proj"])))
    save_adapter(policy, tmp_path)
    again, _ = load_policy(ModelConfig(lora=LoraModelConfig(config_file=str(tmp_path / "adapter_config.json"))))
    config = again.peft_config["default"]
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (4, 8.0, {"v_proj"})
    assert not config.inference_mode and any(p.requires_grad for p in again.parameters())
    with pytest.raises(FileNotFoundError, match="model.lora.config_file"):
        load_policy(ModelConfig(lora=LoraModelConfig(config_file=str(tmp_path / "nowhere"))))


def test_bf16_lora_run_trains_the_float32_adapters_and_f4_measures_them(tmp_path):
    """bfloat16 base weights, float32 adapters, the reference without a copy; the F4 snapshot
    samples the adapters (what trains) and sees them move. The exported hf/final holds the
    merged weights (plain transformers) and the adapter folder (peft)."""
    cfg = make_config(
        3,
        **{
            "model.dtype": "bfloat16",
            "model.lora.rank": 8,
            "algorithm.beta": 0.04,
            "trainer.output_dir": str(tmp_path),
        },
    )
    run = fit(cfg)
    policy = run.module.policy
    dtypes = {n: p.dtype for n, p in policy.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}
    assert isinstance(run.module.reference, AdapterDisabledReference)
    snapshot = next(c for c in run.health.checks if c.name == "no_update").snapshot
    assert snapshot.total == sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert run.health.alerts_for("no_update") == []
    assert run.health.last_metrics["health/no_update/update_norm"] > 0
    assert run.module.last_step.passes[-1].kl_sum > 0  # the adapters moved the policy off its base
    assert run.health.alerts_for("nonfinite") == []
    final = tmp_path / "hf" / "final"
    merged = AutoModelForCausalLM.from_pretrained(final)
    expected = merged_state_dict(policy)
    assert all(torch.equal(t, expected[n]) for n, t in merged.state_dict().items())
    assert any(
        not torch.equal(t, p)
        for n, t in merged.state_dict().items()
        for p in [dict(policy.get_base_model().named_parameters()).get(n.replace(".weight", ".base_layer.weight"))]
        if p is not None
    )
    reloaded = PeftModel.from_pretrained(load_policy(ModelConfig(dtype="bfloat16"))[0], final / "adapter")
    adapters = {n: p for n, p in policy.named_parameters() if ".lora_" in n}
    assert adapters and all(torch.equal(p, adapters[n]) for n, p in reloaded.named_parameters() if ".lora_" in n)


def test_a_deep_copy_reference_keeps_the_policys_dtype_and_log_probs_stay_float32(rollout):
    policy, _ = load_policy(ModelConfig(dtype="bfloat16"))
    module = GRPOModule(policy, AlgorithmConfig(beta=0.1, micro_batch_size=8))
    assert {p.dtype for p in module.reference.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in module.reference.parameters())
    prepared = module.prepare(rollout)
    assert prepared.reference.logp.dtype == torch.float32
    mb = prepared.micro_batches[0]
    out = module.completion_log_probs(policy, mb.input_ids, mb.attention_mask, mb.prompt_width, 1.0)
    assert out.logp.dtype == torch.float32 and torch.isfinite(out.logp).all()


def test_lora_without_kl_has_no_reference():
    policy, _ = lora_policy()
    assert GRPOModule(copy.deepcopy(policy), AlgorithmConfig(beta=0.0)).reference is None


@pytest.mark.parametrize("lora", [True, False])
def test_auto_chunks_are_smaller_only_through_a_frozen_head(monkeypatch, lora):
    """logprob_chunk_mb=auto on a CPU: 32 MB of logits through a head that does not train (LoRA's,
    no head-gradient sum spans blocks), 96 MB through one that does, with or without gradients."""
    seen = []
    real = forward.lm_head_log_probs
    monkeypatch.setattr(forward, "lm_head_log_probs", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    policy = lora_policy()[0] if lora else load_policy(ModelConfig())[0]
    vocab = policy.get_output_embeddings().out_features
    passes = forward.CompletionLogProbs("auto", pack=False)
    mask = torch.ones_like(IDS)
    passes(policy, IDS, mask, prompt_width=3, temperature=1.0)
    with torch.no_grad():
        passes(policy, IDS, mask, prompt_width=3, temperature=1.0)
    rows = {key: int(mb * 2**20) // (4 * vocab) for key, mb in AUTO_LOGPROB_CHUNK_MB.items()}
    assert seen == [rows["cpu, frozen head" if lora else "cpu"]] * 2
    assert rows["cpu, frozen head"] < rows["cpu"]
    assert (
        forward.CompletionLogProbs(64, pack=False)._chunk_rows(vocab, torch.device("cpu"), head=None)
        == rows["cpu"] * 64 // 96
    )  # a number is taken as is
