"""Episodes in rollout.mode=async: played a step ahead in the background, every sampled token stamped with
the weight version of its turn, and the staleness bound applied per token (drop whole groups, or mask)."""

from __future__ import annotations

import threading

import pytest
import torch

from grpo_lightning.data.lookahead import PromptWindow
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import Sampling
from grpo_lightning.rollout.async_generator import AsyncRolloutGenerator
from tests.helpers.episodes import FakeEngine, ScriptedEnv, chatml_tokenizer


class VersionedEngine(FakeEngine):
    """A fake engine with weights of its own: every completion carries the version it holds; ``bump_every``
    generate calls a sync lands (a sync between two turns of one episode). Records the playing threads."""

    owns_weights = True
    supports_async = True

    def __init__(self, *args, version: int = 0, bump_every: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.version, self.bump_every, self.calls, self.threads = version, bump_every, 0, set()

    def generate(self, requests, sampling):
        self.threads.add(threading.current_thread().name)
        self.calls += 1
        if self.bump_every and self.calls % self.bump_every == 0:
            self.version += 1
        out = super().generate(requests, sampling)
        for completion in out:
            completion.weight_version = self.version
        return out


def generator(engine, tokenizer, bound: int, action: str = "drop") -> AsyncRolloutGenerator:
    gen = AsyncRolloutGenerator(
        engine=engine,
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names({"environment": 1.0}),
        num_generations=2,
        sampling=Sampling(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=0),
        seed=3,
        max_staleness=1,
        max_off_policy_steps=bound,
        off_policy_action=action,
    )
    limits = EpisodeLimits(max_turns=3, max_turn_tokens=5, context=300)
    gen.episodes = EpisodeRollout(lambda row: ScriptedEnv(turns=3), limits, ChatRenderer(tokenizer))
    gen.setup(None)
    return gen


def records(step: int) -> list[dict]:
    return [{"prompt": f"p{step}-{i}", "answer": "1"} for i in range(2)]


def test_episodes_play_ahead_and_every_sampled_token_carries_its_turns_version():
    tokenizer = chatml_tokenizer()
    engine = VersionedEngine(len(tokenizer), tokenizer.eos_token_id, eos_rate=0.3, bump_every=2)
    gen = generator(engine, tokenizer, bound=8)
    for step in range(3):
        gen.trainer_version = step
        batch = gen.rollout_for_step(PromptWindow(records(step), [records(step + 1)]), step, rank=0)
        assert step + 1 in gen.pending  # the next step's episodes are queued while this one trains
        episodes = gen.episodes.last_episodes
        versions, mask = batch.token_weight_versions, batch.loss_mask
        assert versions is not None and versions.shape == batch.completion_ids.shape
        sampled = versions[mask.bool()]
        assert bool((sampled >= 0).all()) and bool((versions[~mask.bool()] == -1).all())  # env ids: no version
        for episode in episodes:
            turns = [episode.versions[i] for i, m in enumerate(episode.loss_mask) if m]
            assert turns == sorted(turns)  # a turn's version never goes back
            per_turn = {}
            for version, turn, m in zip(episode.versions, episode.turn_ids, episode.loss_mask, strict=True):
                if m:
                    per_turn.setdefault(turn, set()).add(version)
            assert all(len(v) == 1 for v in per_turn.values())  # one version per turn
            assert batch.weight_version <= min(turns)
        assert batch.timing["rollout/off_policy_dropped"] == 0.0
    assert any(len(set(v for v in e.versions if v >= 0)) > 1 for e in episodes)  # a sync landed mid-episode
    assert engine.threads and "MainThread" not in engine.threads  # played in the background
    gen.close()


@pytest.mark.parametrize("action", ["drop", "mask"])
def test_episode_tokens_beyond_the_bound_are_dropped_by_group_or_masked(action):
    tokenizer = chatml_tokenizer()
    engine = VersionedEngine(len(tokenizer), tokenizer.eos_token_id, eos_rate=0.3, version=0)
    gen = generator(engine, tokenizer, bound=1, action=action)
    gen.trainer_version = 0
    gen.rollout_for_step(PromptWindow(records(0), [records(1)]), 0, rank=0)  # queues step 1 at version 0
    four = [{"prompt": f"q{i}", "answer": "1"} for i in range(4)]
    gen.pending.pop(1).future.result()
    gen.trainer_version, gen.pushed_version = 3, 3
    gen.submit(four[:2], 3, rank=0, now=3)  # played by version 0 while the trainer is at 3: 3 steps stale
    gen.pending[3].future.result()
    engine.version = 3
    gen.submit(four[2:], 4, rank=0, now=3)
    batch = gen.rollout_for_step(PromptWindow(four[:2], []), 3, rank=0)
    assert batch.timing["rollout/staleness_max"] == 3.0
    if action == "drop":  # every group has a token 3 steps stale: none is left, so the batch stays masked out
        assert batch.timing["rollout/off_policy_dropped"] == 4.0 and batch.num_sequences == 4
        assert int(batch.loss_mask.sum()) == 0
    else:
        assert batch.timing["rollout/off_policy_masked_tokens"] > 0 and int(batch.loss_mask.sum()) == 0
    gen.trainer_version = 4
    fresh = gen.rollout_for_step(PromptWindow(four[2:], []), 4, rank=0)  # played by version 3: 1 step, in bound
    on = fresh.loss_mask.bool()
    assert bool(on.any()) and bool((fresh.token_weight_versions[on] == 3).all())
    assert fresh.timing["rollout/off_policy_dropped"] == 0.0 and fresh.timing["rollout/off_policy_masked_tokens"] == 0
    assert torch.equal(fresh.episode_ids, torch.arange(4))
    gen.close()
