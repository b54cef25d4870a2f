"""F1 and F2 by construction: every sample has its own stream; runs repeat exactly."""

from __future__ import annotations

import itertools
import random

import lightning as L
import pytest
import torch
from conftest import PROMPTS, make_generator

from grpo_lightning.config import AlgorithmConfig, RolloutConfig
from grpo_lightning.data import PromptDataModule
from grpo_lightning.models import build_tiny_policy
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling, sample_seed
from grpo_lightning.rollout.sampler import CDF_BLOCK, SeededSampler, counter_uniforms, inverse_cdf
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.tasks import arithmetic_records


def test_seeds_are_distinct_across_rank_step_prompt_sample_and_deterministic():
    keys = list(itertools.product([0, 1], [0, 1], range(2), range(3), range(8)))  # seed, rank, step, prompt, sample
    seeds = [sample_seed(*key) for key in keys]
    assert len(set(seeds)) == len(keys)
    assert seeds == [sample_seed(*key) for key in keys]
    assert all(0 <= s < 2**63 for s in seeds)


def test_two_samples_of_a_group_differ(policy, tokenizer):
    rollout = make_generator(policy, tokenizer, num_generations=8).generate(PROMPTS, step=0, rank=0)
    for group in range(rollout.num_groups):
        texts = rollout.completions[group * 8 : (group + 1) * 8]
        assert len(set(texts)) >= 6, texts  # 8 draws of 8 tokens from ~19 tokens: near-certainly distinct


def test_same_run_repeated_gives_identical_completions(policy, tokenizer):
    first = make_generator(policy, tokenizer, seed=3).generate(PROMPTS, step=5, rank=0)
    again = make_generator(policy, tokenizer, seed=3).generate(PROMPTS, step=5, rank=0)
    assert first.completions == again.completions
    assert torch.equal(first.completion_ids, again.completion_ids)


def test_consecutive_steps_ranks_and_run_seeds_give_different_completions(policy, tokenizer):
    generator = make_generator(policy, tokenizer)
    base = generator.generate(PROMPTS, step=0, rank=0).completions
    assert generator.generate(PROMPTS, step=1, rank=0).completions != base
    assert generator.generate(PROMPTS, step=0, rank=1).completions != base
    other_seed = make_generator(policy, tokenizer, seed=1).generate(PROMPTS, step=0, rank=0)
    assert other_seed.completions != base


def test_a_sample_does_not_depend_on_its_batch_mates(policy, tokenizer):
    engine = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id)
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=8))
    target = GenerationRequest(tokenizer("12+3=")["input_ids"], seed=sample_seed(0, 0, 0, 0, 0))
    others = [GenerationRequest(tokenizer("1+1=")["input_ids"], seed=s) for s in range(5)]
    alone = engine.generate([target], sampling)[0].token_ids
    in_batch = engine.generate(others[:2] + [target] + others[2:], sampling)[2].token_ids
    assert alone == in_batch


def test_engine_logprobs_match_the_policy_distribution(policy, tokenizer):
    engine = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id)
    prompt = tokenizer("4+4=")["input_ids"]
    completion = engine.generate(
        [GenerationRequest(prompt, seed=7)], Sampling.from_config(RolloutConfig(max_new_tokens=5, temperature=0.8))
    )[0]
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = policy(ids).logits[0, len(prompt) - 1 : -1] / 0.8
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-5)


def test_top_k_one_is_greedy_and_top_p_keeps_the_nucleus():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    greedy = SeededSampler([1, 2], Sampling.from_config(RolloutConfig(max_new_tokens=8, top_k=1)))
    assert greedy.draw(logits)[0].tolist() == [1, 0]
    nucleus = SeededSampler(list(range(200)), Sampling.from_config(RolloutConfig(max_new_tokens=8, top_p=0.6)))
    drawn = nucleus.draw(logits[:1].expand(200, -1))[0]
    assert set(drawn.tolist()) == {1, 3}  # the two tokens holding 0.6 of the mass; never 0 or 2


def test_resume_from_a_checkpoint_continues_the_seed_steps(tokenizer, tmp_path):
    """Seeds derive from the generation-batch count, which the checkpoint restores: a resumed
    run never replays the seeds of steps it already took."""

    def fit(checkpoint_every=None, resume_from=None):
        policy = build_tiny_policy(tokenizer)
        generator = make_generator(policy, tokenizer, max_new_tokens=4)
        steps, make = [], generator.generate
        generator.generate = lambda records, step, rank: steps.append(step) or make(records, step, rank)
        extra = (
            [L.pytorch.callbacks.ModelCheckpoint(tmp_path, every_n_train_steps=checkpoint_every, save_top_k=-1)]
            if checkpoint_every
            else []
        )
        trainer = L.Trainer(
            max_steps=4,
            max_epochs=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=bool(extra),
            callbacks=extra,
        )
        data = PromptDataModule(arithmetic_records()[0], prompts_per_step=4, num_batches=4)
        module = GRPOModule(policy, AlgorithmConfig(micro_batch_size=16), rollout=generator)
        trainer.fit(module, datamodule=data, ckpt_path=resume_from)
        return steps

    assert fit(checkpoint_every=2) == [0, 1, 2, 3]
    assert fit(resume_from=str(tmp_path / "epoch=0-step=2.ckpt")) == [2, 3]


def test_sampled_tokens_follow_the_distribution():
    """20k samples, each its own seed: token frequencies match softmax(logits / T) to 0.015."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=8, temperature=0.8))
    sampler = SeededSampler([sample_seed(0, 0, 0, i, 0) for i in range(20000)], sampling)
    tokens, logprobs = sampler.draw(logits.expand(20000, -1))
    expected = torch.softmax(logits[0] / 0.8, dim=-1)
    observed = torch.bincount(tokens, minlength=5).float() / 20000
    assert (observed - expected).abs().max() < 0.015, (observed, expected)
    assert torch.allclose(logprobs, expected.log()[tokens], atol=1e-6)
    second_draw = sampler.draw(logits.expand(20000, -1))[0]
    assert (second_draw != tokens).float().mean() > 0.3  # the stream moves on at each position


def test_counter_uniforms_of_many_counters_at_once_equal_one_call_per_counter():
    """The sampler computes a rollout's uniforms in one call ([B, T]); each must be the one a
    per-token call gives, or resumed and batched draws would change."""
    rng = random.Random(0)
    for _ in range(20):
        seeds = torch.tensor([rng.randrange(-(2**63), 2**63) for _ in range(rng.randint(1, 9))], dtype=torch.int64)
        counters = torch.tensor(sorted(rng.sample(range(10**6), rng.randint(1, 12))), dtype=torch.int64)
        batched = counter_uniforms(seeds, counters)
        assert batched.shape == (len(seeds), len(counters))
        for column, counter in enumerate(counters.tolist()):
            assert torch.equal(batched[:, column], counter_uniforms(seeds, counter))
    # A sampler drawing past the precomputed block (max_new_tokens) continues the same stream.
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=2))
    sampler = SeededSampler([7, 8], sampling)
    logits = torch.zeros(2, 50)
    draws = [sampler.draw(logits)[0] for _ in range(4)]
    reference = SeededSampler([7, 8], Sampling.from_config(RolloutConfig(max_new_tokens=4)))
    assert all(torch.equal(a, reference.draw(logits)[0]) for a in draws)


@pytest.mark.parametrize("case", range(60))
def test_the_blockwise_inverse_cdf_picks_the_token_a_full_cumulative_sum_picks(case):
    """The sampler sums the CDF a block of tokens at a time (a GPU scans a 152k vocabulary slowly);
    the token must be the one the searchsorted of the whole row's cumulative sum gives, at block
    edges, with masked tokens (zero mass) and for a uniform of 0."""
    rng = random.Random(case)
    g = torch.Generator().manual_seed(case)
    rows = rng.randint(1, 8)
    vocab = rng.choice([1, 2, 5, CDF_BLOCK - 1, CDF_BLOCK, CDF_BLOCK + 1, 3 * CDF_BLOCK + 7, 49152, 151936])
    z = torch.randn(rows, vocab, generator=g) * rng.choice([0.1, 1.0, 5.0, 30.0])
    if rng.random() < 0.3:  # a top-k / top-p filter's -inf entries
        z[torch.rand(rows, vocab, generator=g) < 0.9] = float("-inf")
        z[:, rng.randrange(vocab)] = 0.0
    probs = torch.log_softmax(z, dim=-1).double().exp()
    uniforms = torch.rand(rows, generator=g, dtype=torch.float64)
    uniforms[0] = 0.0 if case % 5 == 0 else uniforms[0]
    cdf = probs.cumsum(dim=-1)
    want = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:]).clamp(max=vocab - 1)
    assert torch.equal(inverse_cdf(probs, uniforms), want)
