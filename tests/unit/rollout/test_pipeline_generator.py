"""The pipeline's producer and trainer loop against a scripted engine that takes new weights between
random ticks (tests/helpers/scripted_pipeline.py): every token's recorded version is the one that
produced it, the lag accounting is exact, groups are never split, prompts are drawn in data order
and each is trained once, and a checkpoint taken anywhere resumes without dropping or repeating one."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from grpo_lightning.config import RolloutConfig
from grpo_lightning.data.sampler import PromptSampler
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import Sampling
from grpo_lightning.rollout.pipeline import PipelineRolloutGenerator, PromptStream
from tests.helpers.scripted_pipeline import ScriptedStreamingEngine, version_tensor

TOKENIZER = build_char_tokenizer()
RECORDS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(7) for b in range(5)]


def pipeline(case: random.Random, steps: int, engine=None, **overrides):
    P, G = case.choice([1, 2, 3]), case.choice([2, 3])
    options = dict(max_lag=case.choice([0, 1, 2, 3]), max_in_flight=case.choice([0, 1, 4]), max_off_policy_steps=99)
    options.update(overrides)
    generator = PipelineRolloutGenerator(
        engine=engine or ScriptedStreamingEngine(seed=case.randrange(1000)),
        tokenizer=TOKENIZER,
        scorer=RewardScorer.from_names({"test_length": 1.0}),
        num_generations=G,
        sampling=Sampling.from_config(RolloutConfig(max_new_tokens=case.randint(2, 9))),
        seed=7,
        **options,
    )
    generator.streams = lambda rank, world: PromptStream(
        RECORDS, lambda: PromptSampler(len(RECORDS), steps * P, seed=3, rank=rank, world_size=world, batch_size=P), P
    )
    generator.budget_batches = steps
    generator.setup(None)
    generator.sync_weights(PolicyWeights(version_tensor(0), 0))
    return generator, P, G


def train(generator, steps: int, case: random.Random, first: int = 0):
    """The module's calls, with random training time: a batch per step, then the new weights."""
    batches = []
    for step in range(first, first + steps):
        generator.trainer_version = step
        batches.append(generator.rollout_for_step(None, step=step, rank=0))
        if case.random() < 0.5:
            torch.randn(200, 200) @ torch.randn(200, 200)  # a little training
        generator.sync_weights(PolicyWeights(version_tensor(step + 1), step + 1))
    return batches


def data_order(P: int, steps: int) -> list[str]:
    order = PromptSampler(len(RECORDS), steps * P, seed=3, batch_size=P)
    return [RECORDS[i]["prompt"] for i in order]


def check_batch(batch, step: int, P: int, G: int) -> None:
    real = batch.completion_mask.bool()
    versions, tokens = batch.token_weight_versions, batch.completion_ids
    assert batch.num_sequences == P * G
    # every token says which weights produced it (3 + version % 13); the recorded version agrees
    assert torch.equal(tokens[real], 3 + versions[real] % 13)
    assert torch.allclose(batch.engine_logprobs[real], -(versions[real] % 13).float() / 10)
    lags = (step - versions[real]).tolist()
    assert min(lags) >= 0
    t = batch.timing
    assert t["pipeline/lag_max"] == max(lags) == t["rollout/staleness_max"]
    assert t["pipeline/lag_mean"] == sum(lags) / len(lags)  # exact: the same sum of the same integers
    spans = [len(set(versions[i][real[i]].tolist())) for i in range(batch.num_sequences)]
    assert t["pipeline/versions_per_sequence"] == sum(spans) / len(spans)
    assert t["pipeline/multi_version_seqs"] == sum(s > 1 for s in spans) / len(spans)
    # a group is never split: its G rows are one prompt's, next to each other
    for g in range(P):
        assert len(set(batch.prompts[g * G : (g + 1) * G])) == 1
    # where the cycle went: the trainer busy or waiting, the engine busy, idle or syncing
    assert t["pipeline/trainer_busy_seconds"] + t["pipeline/trainer_wait_seconds"] == pytest.approx(
        t["pipeline/cycle_seconds"]
    )
    engine = t["pipeline/engine_busy_seconds"] + t["pipeline/engine_idle_seconds"] + t["pipeline/engine_sync_seconds"]
    assert engine == pytest.approx(t["pipeline/cycle_seconds"], abs=5e-3)


@pytest.mark.parametrize("seed", range(16))
def test_versions_and_lags_are_exact_and_every_prompt_is_trained_once_in_data_order(seed):
    case, steps = random.Random(seed), 5
    generator, P, G = pipeline(case, steps)
    try:
        batches = train(generator, steps, case)
    finally:
        generator.engine.close()
    for step, batch in enumerate(batches):
        check_batch(batch, step, P, G)
    trained = [batch.prompts[g * G] for batch in batches for g in range(P)]
    assert Counter(trained) == Counter(data_order(P, steps))  # the sync run's prompts, each once
    assert len(generator.engine.applied) == steps + 1  # every update reached the engine


def test_the_engine_really_changes_weights_inside_sequences():
    """Long sequences and a deep pipeline: some sequences span two versions or more, and the lag is > 0."""
    spanning, lagged = 0, 0
    for seed in range(4):
        case = random.Random(100 + seed)
        generator, P, G = pipeline(case, 6, max_lag=2, max_in_flight=0)
        generator.sampling = Sampling.from_config(RolloutConfig(max_new_tokens=40))
        try:
            batches = train(generator, 6, case)
        finally:
            generator.engine.close()
        spanning += sum(b.timing["pipeline/multi_version_seqs"] > 0 for b in batches)
        lagged += sum(b.timing["pipeline/lag_max"] > 0 for b in batches)
    assert spanning > 0 and lagged > 0


@pytest.mark.parametrize("action", ["drop", "mask"])
def test_tokens_beyond_the_bound_are_dropped_by_group_and_replaced_or_masked(action):
    case, steps = random.Random(5), 8
    generator, P, G = pipeline(case, steps, max_lag=1, max_off_policy_steps=1, off_policy_action=action)
    generator.sampling = Sampling.from_config(RolloutConfig(max_new_tokens=60))
    generator.engine.max_pause_s = 0.004
    try:
        batches = train(generator, steps, case)
    finally:
        generator.engine.close()
    removed = "pipeline/dropped_groups" if action == "drop" else "rollout/off_policy_masked_tokens"
    assert sum(b.timing[removed] for b in batches) > 0
    for step, batch in enumerate(batches):
        assert batch.num_sequences == P * G
        trained = batch.trained_mask.bool()
        assert int((step - batch.token_weight_versions[trained]).max()) <= 1  # nothing beyond the bound trains
    ledger = generator.ledger
    assert ledger.counts["trained"] == steps * P  # each dropped group was replaced by the next prompt
    assert ledger.cursor >= steps * P + ledger.counts["dropped"]


@pytest.mark.parametrize("seed", range(6))
def test_a_checkpoint_anywhere_resumes_without_dropping_or_repeating_a_prompt(seed):
    """The state after step k, loaded into a fresh generator (a SIGKILL, then trainer.resume=auto): the
    prompts trained before plus those trained after are the uninterrupted run's, each once."""
    case, steps = random.Random(seed), 6
    cut = random.Random(-seed).randint(1, steps - 1)
    generator, P, G = pipeline(case, steps)
    try:
        first = train(generator, cut, case)
        state = generator.state_dict()
    finally:
        generator.engine.close()
    resumed, _, _ = pipeline(random.Random(seed), steps)  # the same settings (P, G, lag), a fresh engine
    resumed.load_state_dict(state)
    try:
        rest = train(resumed, steps - cut, case, first=cut)
    finally:
        resumed.engine.close()
    trained = [b.prompts[g * G] for b in first + rest for g in range(P)]
    assert Counter(trained) == Counter(data_order(P, steps))


def test_dynamic_sampling_filters_tied_groups_and_tops_up_after_its_rounds():
    case, steps = random.Random(11), 4
    generator, P, G = pipeline(case, steps, max_lag=1, max_in_flight=0)
    generator.filter_tied, generator.max_sampling_rounds = True, 2
    generator.scorer = RewardScorer.from_names({"arithmetic_exact": 1.0})  # all 0: every group is tied
    try:
        batches = train(generator, steps, case)
    finally:
        generator.engine.close()
    assert all(b.num_sequences == P * G for b in batches)
    assert all(b.timing["pipeline/filtered_groups"] > 0 for b in batches)
    assert generator.ledger.counts["filtered"] == sum(b.timing["pipeline/filtered_groups"] for b in batches)
