"""The pipeline's HF engine (rollout.mode=pipeline): with unchanged weights a sample is the sync
engine's (same seeds, tokens, log-probs), also when sequences join rows others left; new weights
arrive between two decode steps without dropping or restarting a sequence, each token records the
version whose forward gave its distribution, and the fused copies then compute the new weights."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from grpo_lightning.config import RolloutConfig
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.models.tiny import build_tiny_policy
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling
from grpo_lightning.rollout.engine import EngineError
from grpo_lightning.rollout.pipeline.hf_engine import HFPipelineEngine

TOKENIZER = build_char_tokenizer()
NO_EOS = -1  # every sequence runs its whole budget


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(TOKENIZER).eval()


def requests(n: int) -> list[GenerationRequest]:
    prompts = [f"{a}+{a * 3 % 10}=" + "1" * (a % 4) for a in range(n)]  # prompts of several lengths
    return [GenerationRequest(TOKENIZER(p)["input_ids"], seed=100 + i) for i, p in enumerate(prompts)]


def sampling(tokens: int) -> Sampling:
    return Sampling.from_config(RolloutConfig(max_new_tokens=tokens, temperature=1.0))


def perturbed(policy) -> torch.nn.Module:
    other = copy.deepcopy(policy)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1)
        for parameter in other.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return other


def pushed(engine: HFPipelineEngine, model, version: int) -> None:
    engine.load_weights(list(model.state_dict().items()), version=version)


def same_samples(got, want) -> None:
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4)


def test_unchanged_weights_sample_what_the_sync_engine_samples(policy):
    """Seven sequences over three rows: most join a row another one left (continuous batching)."""
    engine = HFPipelineEngine(policy, TOKENIZER.pad_token_id, TOKENIZER.eos_token_id, rows=3)
    try:
        pushed(engine, policy, 0)
        got = engine.generate(requests(7), sampling(10))
    finally:
        engine.close()
    want = HFEngine(policy, TOKENIZER.pad_token_id, TOKENIZER.eos_token_id, decoder="fused").generate(
        requests(7), sampling(10)
    )
    same_samples(got, want)
    assert all(c.token_weight_versions == [0] * len(c.token_ids) for c in got)


def test_new_weights_arrive_between_decode_steps_and_the_sequences_go_on(policy):
    new = perturbed(policy)
    engine = HFPipelineEngine(policy, TOKENIZER.pad_token_id, NO_EOS, rows=8)
    reference = HFPipelineEngine(policy, TOKENIZER.pad_token_id, NO_EOS, rows=8)
    step, calls = engine._step, []

    def step_then_push() -> None:  # the trainer's sync lands while the 6th decode step runs
        step()
        calls.append(1)
        if len(calls) == 6:
            threading.Thread(target=pushed, args=(engine, new, 1), daemon=True).start()
            while engine._swap is None:
                pass

    engine._step = step_then_push
    try:
        pushed(engine, policy, 0)
        pushed(reference, policy, 0)
        got = engine.generate(requests(5), sampling(20))
        unswapped = reference.generate(requests(5), sampling(20))
        after = engine.generate(requests(5), sampling(20))  # the fused copies now hold the new weights
    finally:
        engine.close()
        reference.close()
    for c, r in zip(got, unswapped, strict=True):
        assert len(c.token_ids) == 20  # none dropped, none restarted
        # tokens 0..6 come from the prefill's and the first six steps' logits, the rest from the new weights
        assert c.token_weight_versions == [0] * 7 + [1] * 13
        assert c.token_ids[:7] == r.token_ids[:7] and c.logprobs[:7] == pytest.approx(r.logprobs[:7], abs=1e-5)
        assert abs(c.logprobs[7] - r.logprobs[7]) > 1e-3 or c.token_ids[7] != r.token_ids[7]
    sync_new = HFEngine(new, TOKENIZER.pad_token_id, NO_EOS, decoder="fused").generate(requests(5), sampling(20))
    same_samples(after, sync_new)


def test_a_closed_engine_fails_what_waits_instead_of_hanging(policy):
    engine = HFPipelineEngine(policy, TOKENIZER.pad_token_id, NO_EOS, rows=2)
    failures: list[BaseException] = []
    gate = threading.Event()
    step = engine._step
    engine._step = lambda: (gate.wait(), step())
    engine.submit(requests(4), sampling(30), lambda out: None, failures.append)
    closer = threading.Thread(target=engine.close)
    closer.start()
    gate.set()
    closer.join(timeout=10)
    assert not closer.is_alive() and not engine._thread.is_alive()
    assert len(failures) == 1 and "closed with requests in flight" in str(failures[0])
    with pytest.raises(EngineError, match="closed"):
        engine.submit(requests(1), sampling(3), lambda out: None, failures.append)
