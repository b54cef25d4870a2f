"""rollout.hf_decoder=graph: the fixed-shape step computes what the fused decoder's step computes,
the engine draws the same tokens with it as with the fused decoder and the loop (also with the
draw recorded into the step), 16-bit models pass the engine's check, and on a GPU the recorded
CUDA graphs replay the same computation."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_lightning.config import RolloutConfig, TrainConfig
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling
from grpo_lightning.rollout.fused_decode import FusedDecoder, FusedWeights, fused_decode_support
from grpo_lightning.rollout.graph_decode import GraphDecoder, SampledGraphLoop, StaticDecoder, graph_decode_support
from grpo_lightning.rollout.hf import _ForwardDecoder, hf_engine
from grpo_lightning.rollout.sampler import SeededSampler


def small_model(rng: random.Random, dtype=torch.float32, device="cpu"):
    """A random Qwen2 (q/k/v biases) or Llama of a random small GQA shape."""
    config_class, model_class = rng.choice([(Qwen2Config, Qwen2ForCausalLM), (LlamaConfig, LlamaForCausalLM)])
    kv_heads = rng.choice([1, 2])
    heads = kv_heads * rng.choice([1, 3])
    config = config_class(
        vocab_size=rng.randint(40, 200),
        hidden_size=heads * 16,
        intermediate_size=64,
        num_hidden_layers=rng.randint(1, 3),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=rng.random() < 0.5,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.randrange(2**31))
        model = model_class(config).eval()
        for parameter in model.parameters():
            parameter.data.normal_(0.0, 0.2)
    return model.to(device=device, dtype=dtype)


def prompts(rng: random.Random, vocab: int, batch: int, device="cpu"):
    lengths = [rng.randint(1, 7) for _ in range(batch)]
    width = max(lengths)
    ids = torch.tensor([[0] * (width - n) + [rng.randrange(vocab) for _ in range(n)] for n in lengths])
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    return ids.to(device), mask.to(device)


@pytest.mark.parametrize("case", range(10))
def test_the_static_step_equals_the_fused_step(case):
    rng = random.Random(case)
    model = small_model(rng)
    ids, mask = prompts(rng, model.config.vocab_size, rng.randint(1, 5))
    steps = rng.randint(1, 6)
    weights = FusedWeights(model)
    static, fused = StaticDecoder(model, mask, steps, weights), FusedDecoder(model, mask, steps, weights)
    with torch.no_grad():
        assert torch.equal(static.prefill(ids), fused.prefill(ids))
        for step in range(steps):
            tokens = torch.tensor([rng.randrange(model.config.vocab_size) for _ in range(ids.shape[0])])
            got, want = static.step(tokens), fused.step(tokens)
            assert (got - want).abs().max() <= 1e-5, (case, step)
    assert int(static.slot) == ids.shape[1] + steps and int(static.step_index) == steps
    with pytest.raises(RuntimeError, match="more than the"):
        static.step(tokens)


def requests(tokenizer, rng: random.Random, count: int) -> list[GenerationRequest]:
    texts = [f"{rng.randint(0, 99)}+{rng.randint(0, 9999)}=" for _ in range(count)]  # varied lengths: left padding
    return [GenerationRequest(tokenizer(p)["input_ids"], rng.randrange(2**62)) for p in texts]


@pytest.mark.parametrize("temperature", [1.0, 1e-6])
def test_the_graph_engine_draws_the_fused_decoders_tokens(policy, tokenizer, temperature):
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=10, temperature=temperature))
    batch = requests(tokenizer, random.Random(7), 16)

    def engine(decoder):
        return HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, batch_size=10, decoder=decoder)

    graph = engine("graph")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = graph.generate(batch, sampling)
    assert graph.fused_checked is True
    for decoder in ("fused", "loop"):
        want = engine(decoder).generate(batch, sampling)
        assert [c.token_ids for c in got] == [c.token_ids for c in want], decoder
        for a, b in zip(got, want, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_sixteen_bit_models_are_graph_decoded_and_pass_the_check():
    rng = random.Random(3)
    model = small_model(rng, dtype=torch.bfloat16)
    assert "not float32" in fused_decode_support(model, 32)
    assert graph_decode_support(model, 32) is None
    ids, mask = prompts(rng, model.config.vocab_size, 4)
    graph, forward = GraphDecoder(model, mask, 4), _ForwardDecoder(model, mask)
    with torch.no_grad():
        got, want = graph.prefill(ids), forward.prefill(ids)
        assert got.dtype == torch.bfloat16
        scale = float(want.float().abs().max())
        assert (got.float() - want.float()).abs().max() <= 0.05 * scale
        for _ in range(4):
            tokens = torch.tensor([rng.randrange(model.config.vocab_size) for _ in range(ids.shape[0])])
            got, want = graph.step(tokens), forward.step(tokens)
            assert (got.float() - want.float()).abs().max() <= 0.05 * scale


def test_a_graph_decoder_that_disagrees_is_dropped_with_a_warning(policy, tokenizer, monkeypatch):
    real_step = GraphDecoder.step
    monkeypatch.setattr(GraphDecoder, "step", lambda self, tokens: real_step(self, tokens) + 1e-2)
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=6))
    batch = requests(tokenizer, random.Random(5), 8)
    graph = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="graph")
    with pytest.warns(UserWarning, match=r"rollout.hf_decoder=graph: the fused decoder's first step logits"):
        got = graph.generate(batch, sampling)
    assert graph.fused_checked is False
    want = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="loop").generate(batch, sampling)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_recorded_graph_replays_the_static_step(dtype):
    rng = random.Random(11)
    model = small_model(rng, dtype=dtype, device="cuda")
    ids, mask = prompts(rng, model.config.vocab_size, 5, device="cuda")
    weights = FusedWeights(model)
    graph, static = GraphDecoder(model, mask, 6, weights), StaticDecoder(model, mask, 6, weights)
    with torch.no_grad():
        assert torch.equal(graph.prefill(ids), static.prefill(ids))
        for _ in range(6):
            tokens = torch.randint(0, model.config.vocab_size, (ids.shape[0],), device="cuda")
            got, want = graph.step(tokens).clone(), static.step(tokens)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5 if dtype == torch.float32 else 0.05)
    assert graph.graph is not None


def test_checking_for_ended_rows_less_often_gives_the_same_completions(policy, tokenizer):
    """On a GPU the loop checks every ``cuda_check_every`` tokens; here the CPU loop is made to."""
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=120, temperature=2.0))
    batch = requests(tokenizer, random.Random(9), 12)
    want = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="graph").generate(batch, sampling)
    assert all(c.finished for c in want)  # every row ends before the budget: the loop stops early
    longest = max(len(c.token_ids) for c in want)
    sparse = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="graph")
    sparse.check_every = lambda device: 7
    steps = []
    real_step = StaticDecoder.step

    def counting_step(self, tokens):
        steps.append(self.taken)
        return real_step(self, tokens)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StaticDecoder, "step", counting_step)
        got = sparse.generate(batch, sampling)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.logprobs for c in got] == [c.logprobs for c in want]
    assert len(steps) == -(-longest // 7) * 7 - 1  # ran on to the next multiple of 7, no further


def test_model_compile_also_compiles_the_graph_step(policy, tokenizer):
    cfg = TrainConfig()
    cfg.rollout.hf_decoder = "graph"
    assert hf_engine(policy, tokenizer, cfg).compile_decode is False
    cfg.model.compile = True
    assert hf_engine(policy, tokenizer, cfg).compile_decode is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_recorded_step_replays_the_static_step():
    rng = random.Random(12)
    model = small_model(rng, dtype=torch.float32, device="cuda")
    ids, mask = prompts(rng, model.config.vocab_size, 4, device="cuda")
    weights = FusedWeights(model)
    graph = GraphDecoder(model, mask, 5, weights, compiled=True)
    static = StaticDecoder(model, mask, 5, weights)
    with torch.no_grad():
        graph.prefill(ids), static.prefill(ids)
        for _ in range(5):
            tokens = torch.randint(0, model.config.vocab_size, (ids.shape[0],), device="cuda")
            torch.testing.assert_close(graph.step(tokens).clone(), static.step(tokens), rtol=1e-4, atol=1e-4)


def random_sampling(rng: random.Random, max_new_tokens: int) -> Sampling:
    return Sampling(
        max_new_tokens=max_new_tokens,
        temperature=rng.choice([1.0, 0.7, 1.5]),
        top_p=rng.choice([1.0, 0.9, 0.5]),
        top_k=rng.choice([0, 0, 5]),
    )


def reference_loop(decoder, sampler: SeededSampler, logits, pad: int, eos: int):
    """The engine's loop with the draw outside the step: tokens and log-probs [B, max_new_tokens]."""
    ended = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    tokens, logprobs = [], []
    for step in range(sampler.sampling.max_new_tokens):
        token, logprob = sampler.draw(logits)
        token = torch.where(ended, pad, token)
        tokens.append(token)
        logprobs.append(logprob)
        ended |= token == eos
        if step < sampler.sampling.max_new_tokens - 1:
            logits = decoder.step(token)
    return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)


def sampled_loop(decoder, sampler: SeededSampler, logits, pad: int, eos: int) -> SampledGraphLoop:
    loop = SampledGraphLoop(decoder, sampler, logits, pad, eos)
    for step in range(sampler.sampling.max_new_tokens):
        loop.draw() if step == sampler.sampling.max_new_tokens - 1 else loop.draw_and_step()
    return loop


@pytest.mark.parametrize("case", range(12))
def test_the_draw_recorded_with_the_step_draws_what_the_loop_draws(case):
    """Same seeds, same logits, the draw moved into the unit: bit-identical tokens and log-probs,
    ended rows padded, whatever the filter (temperature, top-k, top-p)."""
    rng = random.Random(100 + case)
    model = small_model(rng)
    ids, mask = prompts(rng, model.config.vocab_size, rng.randint(1, 6))
    steps = rng.randint(1, 9)
    sampling = random_sampling(rng, steps)
    seeds = [rng.randrange(2**62) for _ in range(ids.shape[0])]
    weights = FusedWeights(model)

    def reference(pad: int, eos: int):
        decoder = StaticDecoder(model, mask, steps - 1, weights)
        return reference_loop(decoder, SeededSampler(seeds, sampling), decoder.prefill(ids), pad, eos)

    with torch.no_grad():
        # The EOS: a token row 0 draws, so that rows end (and are padded) before the budget.
        pad, eos = 0, int(reference(0, -1)[0][0, rng.randrange(steps)])
        want_tokens, want_logprobs = reference(pad, eos)
        decoder = GraphDecoder(model, mask, steps - 1, weights)
        loop = sampled_loop(decoder, SeededSampler(seeds, sampling), decoder.prefill(ids), pad, eos)
    assert torch.equal(loop.tokens, want_tokens)
    assert torch.equal(loop.logprobs, want_logprobs)
    assert torch.equal(loop.ended, (want_tokens == eos).any(dim=1))
    assert int(loop.column) == steps and decoder.taken == steps - 1


def test_a_checked_graph_engine_draws_inside_the_step_and_matches_the_fused_decoder(policy, tokenizer, monkeypatch):
    """The first rollout is checked against the forward (the draw outside); later ones record the
    draw with the step. Both give the fused decoder's completions, for random filters."""
    units = []
    real_unit = SampledGraphLoop.draw_and_step
    monkeypatch.setattr(SampledGraphLoop, "draw_and_step", lambda self: units.append(1) or real_unit(self))
    rng = random.Random(21)
    graph = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="graph")
    fused = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="fused")
    for rollout in range(4):
        sampling = random_sampling(rng, rng.randint(2, 12))
        batch = requests(tokenizer, rng, rng.randint(1, 9))
        got, want = graph.generate(batch, sampling), fused.generate(batch, sampling)
        assert [c.token_ids for c in got] == [c.token_ids for c in want], rollout
        assert [c.finished for c in got] == [c.finished for c in want], rollout
        for a, b in zip(got, want, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert (len(units) > 0) == (rollout > 0), "only rollouts after the checked one draw inside the step"


def test_the_recorded_draw_checks_for_ended_rows_every_few_tokens(policy, tokenizer):
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=120, temperature=2.0))
    batch = requests(tokenizer, random.Random(9), 12)
    want = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="loop").generate(batch, sampling)
    assert all(c.finished for c in want)
    longest = max(len(c.token_ids) for c in want)
    sparse = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="graph")
    sparse.fused_checked = True  # as after its first rollout: the draw goes inside the step
    sparse.check_every = lambda device: 7
    units = []
    real_unit = SampledGraphLoop.draw_and_step
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SampledGraphLoop, "draw_and_step", lambda self: units.append(1) or real_unit(self))
        got = sparse.generate(batch, sampling)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert len(units) == -(-longest // 7) * 7  # drew on to the next multiple of 7, no further


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled", [False, True])
def test_the_recorded_draw_and_step_replays_the_eager_unit(compiled):
    rng = random.Random(13)
    model = small_model(rng, dtype=torch.float32, device="cuda")
    ids, mask = prompts(rng, model.config.vocab_size, 6, device="cuda")
    sampling = Sampling(max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=0)
    seeds = [rng.randrange(2**62) for _ in range(ids.shape[0])]
    weights = FusedWeights(model)
    with torch.no_grad():
        recorded = GraphDecoder(model, mask, 7, weights, compiled=compiled)
        loop = sampled_loop(recorded, SeededSampler(seeds, sampling), recorded.prefill(ids), 0, 3)
        eager = StaticDecoder(model, mask, 7, weights)
        want_tokens, want_logprobs = reference_loop(eager, SeededSampler(seeds, sampling), eager.prefill(ids), 0, 3)
    assert loop.graph is not None
    assert torch.equal(loop.tokens, want_tokens)
    torch.testing.assert_close(loop.logprobs, want_logprobs, rtol=0, atol=1e-4)
