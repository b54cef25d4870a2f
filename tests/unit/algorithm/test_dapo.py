"""DAPO's pieces: dynamic sampling (informative groups only, a cap on rounds, reproducible
extra prompts and seeds), overlong filtering (algorithm.mask_truncated) and the soft overlong
punishment in tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import fit, make_config, make_generator

from grpo_lightning.algorithm import tied_groups
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.rewards import register_reward
from grpo_lightning.rewards.overlong import overlong_penalty_value
from grpo_lightning.rollout.dynamic_sampling import DynamicSampling
from grpo_lightning.step.module import GRPOModule, StepResult
from grpo_lightning.tasks.arithmetic import arithmetic_records


@register_reward("test_odd_first_only")
def odd_first_only(prompts, completions, **_):
    """Signal (the completion's length) only for prompts whose first operand starts with an odd digit."""
    return [len(c) / 10 if int(p[0]) % 2 else 0.0 for p, c in zip(prompts, completions, strict=True)]


@register_reward("test_zero")
def zero(prompts, completions, **_):
    return [0.0] * len(completions)


def _records():
    train, _ = arithmetic_records(9, "+", 0.0, 0)
    return train


def test_overlong_penalty_values_in_tokens():
    # budget 10, buffer 4: free up to 6 tokens, then linear to -1 at 10
    assert [overlong_penalty_value(n, 10, 4) for n in (3, 6, 7, 8, 10, 11)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="overlong_buffer_tokens"):
        overlong_penalty_value(3, 10, 0)


def test_overlong_penalty_scores_token_lengths_through_the_rollout(policy, tokenizer):
    """Scored from the completions' token counts (EOS included) with the default buffer, a fifth of 8 = 2."""
    gen = make_generator(policy, tokenizer, max_new_tokens=8, rewards={"overlong_penalty": 1.0})
    batch = gen.generate(_records()[:4], step=0, rank=0)
    lengths = batch.completion_mask.sum(dim=1).tolist()
    assert batch.rewards.tolist() == pytest.approx([overlong_penalty_value(n, 8, 2) for n in lengths])
    assert min(lengths) <= 6 < max(lengths)  # both sides of the buffer are exercised


def test_dynamic_sampling_keeps_informative_groups_and_continues_the_seeds(policy, tokenizer):
    pool = _records()
    odd = [r for r in pool if int(r["prompt"][0]) % 2]
    even = [r for r in pool if not int(r["prompt"][0]) % 2]
    records = [odd[0], even[0], odd[1], even[1]]
    gen = make_generator(policy, tokenizer, rewards={"test_odd_first_only": 1.0})
    plain = gen.generate(records, step=3, rank=0)
    gen.dynamic = DynamicSampling(pool, max_rounds=5)
    batch = gen.rollout_for_step(records, step=3, rank=0)
    t = batch.timing
    size = gen.num_generations
    assert batch.num_groups == 4 and not tied_groups(batch.rewards, size).any()
    assert all(int(p[0]) % 2 for p in batch.prompts)
    assert t["rollout/sampling_rounds"] >= 2 and t["rollout/prompts_generated"] == 4 * t["rollout/sampling_rounds"]
    assert t["rollout/informative_groups"] == 4 and t["rollout/informative_frac_first_round"] == 0.5
    # round 0's kept groups are exactly what plain generation gives them (same seeds: prompts 0 and 2)
    for new_group, old_group in ((0, 0), (1, 2)):
        new = batch.completions[new_group * size : (new_group + 1) * size]
        assert new == plain.completions[old_group * size : (old_group + 1) * size]
    # the extra prompts are the seeded draw of round 1 (and later), prompts of this step excluded
    drawn = gen.dynamic.extra_prompts(gen.seed, 0, 3, 1, 4, {r["prompt"] for r in records})
    assert batch.prompts[2 * size] == next(r["prompt"] for r in drawn if int(r["prompt"][0]) % 2)
    # the same step again: the same batch, bit for bit
    again = gen.rollout_for_step(records, step=3, rank=0)
    assert again.completions == batch.completions and torch.equal(again.rewards, batch.rewards)


def test_dynamic_sampling_stops_at_the_cap_and_keeps_the_batch_shape(policy, tokenizer):
    gen = make_generator(policy, tokenizer, rewards={"test_zero": 1.0})
    gen.dynamic = DynamicSampling(_records(), max_rounds=3)
    batch = gen.rollout_for_step(_records()[:4], step=0, rank=0)
    assert batch.num_groups == 4 and tied_groups(batch.rewards, 4).all()
    assert batch.timing["rollout/sampling_rounds"] == 3 and batch.timing["rollout/prompts_generated"] == 12
    assert batch.timing["rollout/informative_groups"] == 0


def test_dynamic_sampling_runs_repeat_identically():
    settings = {"rollout.dynamic_sampling": True, "rollout.prompts_per_step": 4, "rollout.max_sampling_rounds": 4}
    first, second = fit(make_config(3, **settings)), fit(make_config(3, **settings))
    a, b = first.module.last_step.rollout, second.module.last_step.rollout
    assert a.completions == b.completions and a.prompts == b.prompts and torch.equal(a.rewards, b.rewards)
    assert a.timing["rollout/sampling_rounds"] == b.timing["rollout/sampling_rounds"]


def test_mask_truncated_drops_cut_completions_from_every_term(policy, rollout):
    finished = torch.arange(rollout.num_sequences) % 3 != 0  # every third completion was cut
    rollout.finished = finished
    cfg = AlgorithmConfig(mask_truncated=True, loss_agg="token_mean", beta=0.1, micro_batch_size=16)
    module = GRPOModule(policy, cfg)
    prepared = module.prepare(rollout)
    stats = module.accumulate_gradients(rollout, prepared)
    lengths = rollout.completion_mask.sum(dim=1).float()
    kept = lengths * finished
    assert stats.kept_tokens == kept.sum().item()
    assert float(prepared.normalizer) == kept.sum().item()  # the normalizer counts finished tokens only
    # ratio 1: the policy term is token_mean of -A over the finished completions
    expected = float(-(prepared.advantages * kept).sum() / kept.sum())
    assert stats.policy_loss == pytest.approx(expected, abs=1e-6)


def test_mask_truncated_with_every_completion_cut_skips_the_step_without_a_nonfinite_count(policy, rollout):
    rollout.finished = torch.zeros(rollout.num_sequences, dtype=torch.bool)
    module = GRPOModule(policy, AlgorithmConfig(mask_truncated=True, beta=0.0))
    stats = module.accumulate_gradients(rollout, module.prepare(rollout))
    assert stats.kept_tokens == 0 and stats.finite_loss and stats.loss == 0.0
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    before = [p.detach().clone() for p in policy.parameters()]
    module.optimizers = lambda: optimizer  # no Trainer here
    result = StepResult()
    for _ in range(5):  # more than max_consecutive_skips: must not stop training
        module._guarded_step(stats, result)
    assert result.skipped == ["nothing_in_loss"] * 5
    assert module.counters.skipped_steps == 0 and module.counters.consecutive_skips == 0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
