"""rollout.hf_decoder=fused: the fused prefill and one-token step compute the model's own forward,
for every architecture and shape it accepts, and the engine falls back to the forward (with a
warning) wherever it does not."""

from __future__ import annotations

import random
import warnings

import peft
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_lightning.config import RolloutConfig
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling, fused_decode
from grpo_lightning.rollout.fused_decode import FusedDecoder, fused_decode_support, shared_rows
from grpo_lightning.rollout.hf import _ForwardDecoder

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}


def random_model(rng: random.Random):
    """A small random model of a random supported architecture and shape (GQA, biases, tied
    embeddings, rotary base and scaling all drawn)."""
    name = rng.choice(sorted(ARCHITECTURES))
    config_class, model_class = ARCHITECTURES[name]
    kv_heads = rng.choice([1, 2, 4])
    heads = kv_heads * rng.choice([1, 2, 3])
    head_dim = rng.choice([8, 16, 32])
    kwargs = dict(
        vocab_size=rng.randint(20, 300),
        hidden_size=heads * rng.choice([8, 16]),
        intermediate_size=rng.choice([32, 96, 160]),
        num_hidden_layers=rng.randint(1, 3),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=256,
        rope_theta=rng.choice([10000.0, 500000.0]),
        tie_word_embeddings=rng.random() < 0.5,
        rms_norm_eps=rng.choice([1e-5, 1e-6]),
    )
    if name == "llama":
        kwargs.update(attention_bias=rng.random() < 0.5, mlp_bias=rng.random() < 0.5)
        if rng.random() < 0.3:
            kwargs["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    config = config_class(**kwargs)
    config._attn_implementation = rng.choice(["sdpa", "eager"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.randrange(2**31))
        model = model_class(config).eval()
        for parameter in model.parameters():  # biases are zero-initialized: make them count
            parameter.data.normal_(0.0, 0.2)
    return name, model


def left_padded_prompts(rng: random.Random, vocab: int, batch: int):
    lengths = [rng.randint(1, 9) for _ in range(batch)]
    width = max(lengths)
    ids = torch.tensor([[0] * (width - n) + [rng.randrange(vocab) for _ in range(n)] for n in lengths])
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    return ids, mask


@pytest.mark.parametrize("case", range(24))
def test_fused_prefill_and_steps_equal_the_models_forward(case):
    rng = random.Random(case)
    name, model = random_model(rng)
    assert fused_decode_support(model, 64) is None, name
    ids, mask = left_padded_prompts(rng, model.config.vocab_size, rng.randint(1, 7))
    # Rows repeating one another (a group's samples of one prompt): each distinct one prefilled once.
    rows = [rng.randrange(len(ids)) for _ in range(rng.randint(1, 9))] if case % 2 else list(range(len(ids)))
    ids, mask, shared = ids[rows], mask[rows], shared_rows(rows)
    steps = rng.randint(1, 8)
    fused, forward = FusedDecoder(model, mask, steps), _ForwardDecoder(model, mask)
    with torch.no_grad():
        if shared is None:
            got = fused.prefill(ids)
        else:
            got = fused.prefill_embeddings(model.get_input_embeddings()(ids[shared.firsts]), shared)
        want = forward.prefill(ids)
        assert (got - want).abs().max() <= 1e-5, (name, "prefill", shared)
        for step in range(steps):
            tokens = torch.tensor([rng.randrange(model.config.vocab_size) for _ in range(ids.shape[0])])
            got, want = fused.step(tokens), forward.step(tokens)
            assert (got - want).abs().max() <= 1e-5, (name, step)
    with pytest.raises(RuntimeError, match="more than the"):
        fused.step(tokens)


def requests(tokenizer, rng: random.Random, count: int) -> list[GenerationRequest]:
    prompts = [f"{rng.randint(0, 99)}+{rng.randint(0, 9999)}=" for _ in range(count)]  # varied lengths: left padding
    return [GenerationRequest(tokenizer(p)["input_ids"], rng.randrange(2**62)) for p in prompts]


def engine(policy, tokenizer, decoder: str) -> HFEngine:
    return HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, batch_size=10, decoder=decoder)


def test_the_engine_checks_the_fused_decoder_once_then_keeps_it(policy, tokenizer):
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=10))
    fused, loop = engine(policy, tokenizer, "fused"), engine(policy, tokenizer, "loop")
    assert fused.fused_checked is None
    for round in range(2):  # the first rollout is checked against the forward, the second is fused only
        batch = requests(tokenizer, random.Random(round), 16)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = fused.generate(batch, sampling)
        assert fused.fused_checked is True
        want = loop.generate(batch, sampling)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        for a, b in zip(got, want, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_fused_decoder_that_disagrees_is_dropped_with_a_warning(policy, tokenizer, monkeypatch):
    real_step = FusedDecoder.step
    monkeypatch.setattr(FusedDecoder, "step", lambda self, tokens: real_step(self, tokens) + 1e-2)
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=8))
    batch = requests(tokenizer, random.Random(5), 12)
    fused = engine(policy, tokenizer, "fused")
    with pytest.warns(
        UserWarning, match=r"first step logits of LlamaForCausalLM differ from its forward's by 1.00e-02"
    ):
        got = fused.generate(batch, sampling)
    assert fused.fused_checked is False
    want = engine(policy, tokenizer, "loop").generate(batch, sampling)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]  # the forward's logits were used
    built = []
    monkeypatch.setattr(fused_decode.FusedDecoder, "__init__", lambda *a: built.append(a))
    fused.generate(batch, sampling)
    assert built == []  # dropped for good: no fused decoder is built again


def test_unsupported_models_and_autocast_keep_the_forward(policy, tokenizer):
    assert "autocast is on" in _support_under_autocast(policy)
    gelu = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=1,
            hidden_act="gelu",
        )
    )
    assert "hidden_act='gelu'" in fused_decode_support(gelu, 16)
    assert "bfloat16" not in (fused_decode_support(policy, 16) or "")
    assert "not float32" in fused_decode_support(LlamaForCausalLM(policy.config).to(torch.bfloat16), 16)
    window = MistralForCausalLM(
        MistralConfig(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            sliding_window=8,
        )
    )
    assert fused_decode_support(window, 8) is None
    assert "sliding_window=8 is shorter than the rollout (9 positions)" in fused_decode_support(window, 9)
    dynamic = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=1,
            rope_scaling={"rope_type": "dynamic", "factor": 2.0},
        )
    )
    assert "rotary type 'dynamic'" in fused_decode_support(dynamic, 16)
    # Under autocast the engine decodes with the forward, and says so once.
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=6))
    batch = requests(tokenizer, random.Random(3), 8)
    fused = engine(policy, tokenizer, "fused")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fused.generate(batch, sampling)
        want = engine(policy, tokenizer, "loop").generate(batch, sampling)
    assert fused.fused_checked is False
    assert [c.token_ids for c in got] == [c.token_ids for c in want]


def test_a_lora_policy_keeps_the_forward(policy):
    lora = peft.get_peft_model(policy, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    reason = fused_decode_support(lora.get_base_model(), 16)
    assert reason is not None and "LoRA" in reason
    assert "is not one of" in fused_decode_support(lora, 16)


def _support_under_autocast(model) -> str:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return fused_decode_support(model, 16)


def test_the_fused_weights_are_built_once_per_rollout_and_not_kept(policy, tokenizer, monkeypatch):
    """Copies of the weights: one per generate call (shared by its chunks), none held after it."""
    built = []
    real_init = fused_decode.FusedWeights.__init__
    monkeypatch.setattr(
        fused_decode.FusedWeights, "__init__", lambda self, model: built.append(1) or real_init(self, model)
    )
    fused = engine(policy, tokenizer, "fused")  # chunks of 10 requests
    for round in range(2):
        fused.generate(
            requests(tokenizer, random.Random(round), 25), Sampling.from_config(RolloutConfig(max_new_tokens=5))
        )
        assert len(built) == round + 1
        assert fused._fused_weights is None


def test_a_model_whose_fused_weights_would_be_large_keeps_the_forward(monkeypatch):
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    )
    copied = 2 * 4 * (3 * 64 * 64 + 2 * 128 * 64)  # q, k, v and gate, up of 2 layers, float32
    monkeypatch.setattr(fused_decode, "FUSED_MAX_COPY_BYTES", copied)
    assert fused_decode_support(model, 16) is None
    monkeypatch.setattr(fused_decode, "FUSED_MAX_COPY_BYTES", copied - 1)
    assert "would copy 0 MiB per rollout" in fused_decode_support(model, 16)
