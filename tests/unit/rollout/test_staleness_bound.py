"""Bounded staleness of async rollouts (rollout.max_off_policy_steps), in the style of AReaL's
staleness-manager tests: the bound is respected, a zero bound is synchronous generation, and the
admission capacity grows with the weight version."""

from __future__ import annotations

import torch
from conftest import PROMPTS, make_generator

from grpo_lightning.data.lookahead import PromptWindow
from grpo_lightning.records import Completion, PolicyWeights
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import RolloutGenerator
from grpo_lightning.rollout.async_generator import AsyncRolloutGenerator, bound_staleness
from tests.helpers.lying_engines import OwnWeightsEngine


def _completion(versions: list[int]) -> Completion:
    return Completion(token_ids=[5] * len(versions), finished=True, token_weight_versions=versions)


def test_drop_removes_whole_groups_with_a_token_beyond_the_bound():
    completions = [_completion([3, 3]), _completion([1, 3]), _completion([3]), _completion([2, 2])]
    keep, kept, counts = bound_staleness(completions, group_size=2, now=4, bound=2, action="drop")
    assert keep == [2, 3] and kept == completions[2:]  # token of version 1 is 3 steps old: group 0 goes
    assert counts["rollout/off_policy_dropped"] == 2 and counts["rollout/staleness_max"] == 3


def test_mask_keeps_the_samples_and_masks_only_the_tokens_beyond_the_bound():
    completions = [_completion([1, 3, 4]), _completion([4, 4, 4])]  # the first spans two syncs
    keep, kept, counts = bound_staleness(completions, group_size=2, now=4, bound=2, action="mask")
    assert keep == [0, 1]
    assert kept[0].loss_mask == [0, 1, 1] and kept[1].loss_mask is None
    assert counts["rollout/off_policy_masked_tokens"] == 1 and counts["rollout/off_policy_dropped"] == 0


def test_drop_of_every_group_masks_instead_and_unversioned_tokens_are_never_stale():
    keep, kept, counts = bound_staleness([_completion([0]), _completion([0])], 2, now=5, bound=1, action="drop")
    assert keep == [0, 1] and all(c.loss_mask == [0] for c in kept)
    assert counts["rollout/off_policy_masked_tokens"] == 2 and counts["rollout/off_policy_dropped"] == 2
    plain = [Completion(token_ids=[5], finished=True)] * 2
    assert bound_staleness(plain, 2, now=9, bound=0)[2]["rollout/staleness_max"] == 0


def _async(policy, tokenizer, bound: int, delay: int = 0, action: str = "drop", staleness: int = 2):
    base = make_generator(policy, tokenizer, max_new_tokens=4)
    return AsyncRolloutGenerator(
        engine=OwnWeightsEngine(policy, tokenizer.eos_token_id, version_delay=delay),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names({"test_length": 1.0}),
        num_generations=4,
        sampling=base.sampling,
        max_staleness=staleness,
        max_off_policy_steps=bound,
        off_policy_action=action,
    )


def _records(step: int) -> list[dict]:
    return [PROMPTS[step % 4], PROMPTS[(step + 1) % 4]]


def _drive(generator, steps: int, policy) -> list:
    """The module's calls: a forced sync at the start, a batch per step, a sync after each."""
    windows = [_records(i) for i in range(steps + 4)]
    generator.setup(policy)
    generator.sync_weights(PolicyWeights(policy.state_dict().items(), 0))
    batches = []
    for step in range(steps):
        window = PromptWindow(windows[step], windows[step + 1 : step + 1 + generator.max_staleness])
        batches.append(generator.rollout_for_step(window, step=step, rank=0))
        generator.sync_weights(PolicyWeights(policy.state_dict().items(), step + 1))
    return batches


def _max_trained_lag(batch, step: int) -> int:
    """The largest lag of a token the loss counts (0 where the engine said no version)."""
    versions = batch.token_weight_versions
    lags = (step - versions)[batch.trained_mask.bool() & (versions >= 0)]
    return int(lags.max()) if lags.numel() else 0


def test_the_bound_is_respected_with_an_engine_that_falls_behind(policy, tokenizer):
    for action in ("drop", "mask"):
        generator = _async(policy, tokenizer, bound=1, delay=2, action=action)
        batches = _drive(generator, 4, policy)
        for step, batch in enumerate(batches):
            assert _max_trained_lag(batch, step) <= 1
        removed = "rollout/off_policy_dropped" if action == "drop" else "rollout/off_policy_masked_tokens"
        assert sum(b.timing[removed] for b in batches) > 0  # the slow engine's lag would exceed the bound
        assert max(b.timing["rollout/staleness_max"] for b in batches) > 1


def test_zero_staleness_equals_synchronous_generation(policy, tokenizer):
    batches = _drive(_async(policy, tokenizer, bound=0), 3, policy)
    sync = RolloutGenerator(
        engine=OwnWeightsEngine(policy, tokenizer.eos_token_id),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names({"test_length": 1.0}),
        num_generations=4,
        sampling=make_generator(policy, tokenizer, max_new_tokens=4).sampling,
    )
    for step, batch in enumerate(batches):
        expected = sync.generate(_records(step), step=step, rank=0)
        assert torch.equal(batch.completion_ids, expected.completion_ids)
        assert batch.timing["rollout/staleness"] == 0 and _max_trained_lag(batch, step) == 0


def test_admission_capacity_grows_with_the_weight_version(policy, tokenizer):
    generator = _async(policy, tokenizer, bound=3)
    generator.trainer_version = 5
    capacity = []
    for pushed in range(2, 6):  # the engine's weights catch up with the trainer's
        generator.pushed_version = pushed
        capacity.append(sum(generator.admits(offset, step=5) for offset in range(10)))
    assert capacity == [1, 2, 3, 4]  # offsets 0 .. bound - (trainer - pushed)
    generator.engine_delay = 1  # the engine reported versions one behind: one batch less ahead
    assert sum(generator.admits(offset, step=5) for offset in range(10)) == 3
