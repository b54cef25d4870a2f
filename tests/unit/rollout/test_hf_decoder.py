"""rollout.hf_decoder: the bare KV-cache loop and the fused decoder draw exactly what model.generate draws."""

from __future__ import annotations

import random

import pytest

from grpo_lightning.config import RolloutConfig
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling


def requests(tokenizer, rng: random.Random, count: int) -> list[GenerationRequest]:
    prompts = [f"{rng.randint(0, 99)}+{rng.randint(0, 9999)}=" for _ in range(count)]  # varied lengths: left padding
    return [GenerationRequest(tokenizer(p)["input_ids"], rng.randrange(2**62)) for p in prompts]


@pytest.mark.parametrize("decoder", ["loop", "fused"])
@pytest.mark.parametrize(
    "sampling",
    [
        Sampling.from_config(RolloutConfig(max_new_tokens=12)),
        Sampling.from_config(RolloutConfig(max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=5)),
        Sampling.from_config(RolloutConfig(max_new_tokens=6, temperature=1e-6)),  # greedy, as evaluation runs
    ],
)
def test_loop_and_generate_draw_the_same_tokens_and_log_probs(policy, tokenizer, sampling, decoder):
    rng = random.Random(sampling.max_new_tokens)
    batch = requests(tokenizer, rng, 24)
    loop = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, batch_size=10, decoder=decoder)
    generate = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, batch_size=10, decoder="generate")
    got, want = loop.generate(batch, sampling), generate.generate(batch, sampling)
    assert loop.fused_checked is (True if decoder == "fused" else None)  # the fused decoder ran, checked
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finished for c in got] == [c.finished for c in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert any(len(c.token_ids) > 1 for c in got)
    if sampling.temperature > 0.5:  # random tokens reach EOS in some rows: early-ended rows are covered
        assert any(c.finished for c in got) and not all(c.finished for c in got)


def test_an_unknown_decoder_is_an_error_naming_the_field(policy, tokenizer):
    with pytest.raises(ValueError, match=r"rollout.hf_decoder='beam' is not allowed"):
        HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, decoder="beam")
