"""The episode runner's bookkeeping: the sampled ids are trained on as sampled, environment ids never."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from grpo_lightning.environments.base import Reset, Step
from grpo_lightning.environments.episode import EpisodeRunner, turn_seed
from grpo_lightning.environments.limits import DONE, ENV_ERROR, EPISODE_TIMEOUT, STEP_TIMEOUT, EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.errors import PluginError
from grpo_lightning.rollout.engine import Sampling
from tests.helpers.episodes import FakeEngine, ScriptedEnv, chatml_tokenizer

TOKENIZER = chatml_tokenizer()
SAMPLING = Sampling(max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0)


def play(engine, limits, env=lambda row: ScriptedEnv(), rows=4, group=2, seed=0, renderer=None):
    runner = EpisodeRunner(engine, renderer or ChatRenderer(TOKENIZER), env, limits, SAMPLING, batch_window_s=0.001)
    reset_seeds = [seed * 100 + i // group for i in range(rows)]
    sample_seeds = [seed * 1000 + i for i in range(rows)]
    return runner.run([{"prompt": f"p{i // group}"} for i in range(rows)], reset_seeds, sample_seeds)


def test_random_engine_and_environment_keep_every_sampled_id_and_mask_every_environment_id():
    for case in range(40):
        rng = random.Random(case)
        engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id, eos_rate=rng.choice([0.05, 0.2, 0.5]))
        limits = EpisodeLimits(
            max_turns=rng.randint(1, 6),
            max_turn_tokens=rng.randint(1, 12),
            max_total_tokens=rng.choice([None, rng.randint(30, 90)]),
            context=rng.randint(40, 120),
        )
        turns = rng.randint(1, 5)
        episodes = play(engine, limits, lambda row, t=turns, r=rng: ScriptedEnv(turns=t, reply_len=r.randint(1, 9)))
        by_seed = {s: e for e in episodes for s in e.turn_seeds}
        sampled: dict[int, list[int]] = {id(e): [] for e in episodes}
        logprobs: dict[int, list[float]] = {id(e): [] for e in episodes}
        for prompt, seed, budget in engine.requests:
            episode = by_seed[seed]
            final = episode.prompt_ids + episode.ids
            assert final[: len(prompt)] == prompt, "a turn's request is not a prefix of the final ids"
            assert 0 < budget <= limits.max_turn_tokens and len(prompt) + budget <= limits.context
            if limits.max_total_tokens is not None:
                assert len(prompt) + budget <= limits.max_total_tokens
            out = engine.outputs[(tuple(prompt), seed)]
            assert final[len(prompt) : len(prompt) + len(out.token_ids)] == out.token_ids
            sampled[id(episode)] += out.token_ids
            logprobs[id(episode)] += out.logprobs
        for episode in episodes:
            n = len(episode.ids)
            assert len(episode.loss_mask) == len(episode.logprobs) == len(episode.turn_ids) == n
            assert len(episode.prompt_ids) + n <= limits.context
            assert [t for t, m in zip(episode.ids, episode.loss_mask, strict=True) if m] == sampled[id(episode)]
            assert [p for p, m in zip(episode.logprobs, episode.loss_mask, strict=True) if m] == logprobs[id(episode)]
            assert all(p == 0.0 for p, m in zip(episode.logprobs, episode.loss_mask, strict=True) if not m)
            assert episode.turn_ids == sorted(episode.turn_ids) and episode.num_turns <= limits.max_turns
            assert episode.stop_reason and not episode.failed
            completion = episode.completion()
            assert completion.loss_mask == episode.loss_mask and completion.finished == (episode.stop_reason == DONE)


def test_environment_ids_are_the_template_render_of_the_conversation():
    """With canonical ids, the accumulated ids equal a full render (ChatML keeps every turn a prefix)."""
    canonical = [TOKENIZER.convert_tokens_to_ids(c) for c in "abc xyz.\n"]
    for case in range(10):
        engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id, eos_rate=0.2, ids=canonical)
        renderer = ChatRenderer(TOKENIZER)
        limits = EpisodeLimits(max_turns=4, max_turn_tokens=50, context=10_000)
        for episode in play(engine, limits, lambda row: ScriptedEnv(turns=4), seed=case, renderer=renderer):
            assert episode.stop_reason == DONE and episode.ids[-1] == TOKENIZER.eos_token_id
            history = episode.messages[:-1]  # the environment's last reply ends the episode: not appended
            full = renderer.encode(renderer.render(history))
            assert episode.prompt_ids + episode.ids + renderer.close_ids(episode.ids) == full


def test_a_groups_first_observations_are_identical_and_seeds_are_recorded():
    engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id)
    episodes = play(engine, EpisodeLimits(max_turns=2, max_turn_tokens=4, context=200), rows=6, group=3)
    assert episodes[0].prompt_ids == episodes[1].prompt_ids == episodes[2].prompt_ids
    assert episodes[3].prompt_ids == episodes[4].prompt_ids == episodes[5].prompt_ids
    assert episodes[0].prompt_ids != episodes[3].prompt_ids  # another group, another game
    assert [e.reset_seed for e in episodes] == [0, 0, 0, 1, 1, 1]
    assert all(e.turn_seeds[0] == e.sample_seed for e in episodes)
    assert episodes[0].turn_seeds[1] == turn_seed(episodes[0].sample_seed, 1) != episodes[0].sample_seed


def test_failed_episodes_stay_in_the_batch_masked_out_and_environments_are_closed():
    engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id)
    envs: list[ScriptedEnv] = []

    def make(row):
        envs.append(ScriptedEnv(turns=5, fail_at=2 if row["prompt"] == "p0" else None, use_async=True))
        return envs[-1]

    episodes = play(engine, EpisodeLimits(max_turns=5, max_turn_tokens=4, context=500), make)
    assert [e.stop_reason for e in episodes] == [ENV_ERROR, ENV_ERROR, DONE, DONE]
    assert "scripted failure" in episodes[0].error and all(env.closed for env in envs)
    failed = episodes[0].completion()
    assert len(failed.token_ids) > 0 and set(failed.loss_mask) == {0}


class SlowEnv(ScriptedEnv):
    def __init__(self, seconds: float, asynchronous: bool):
        super().__init__(turns=3)
        self.seconds, self.asynchronous = seconds, asynchronous

    def reset(self, seed, row):
        return Reset(messages=[{"role": "user", "content": "go"}])

    def step(self, turn):
        time.sleep(self.seconds)
        return Step(messages=[{"role": "user", "content": "x"}])


class AsyncSlowEnv(SlowEnv):
    async def step(self, turn):
        await asyncio.sleep(self.seconds)
        return Step(messages=[{"role": "user", "content": "x"}])


def test_step_and_episode_timeouts_fire_and_fail_only_their_episode():
    engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id)
    start = time.perf_counter()
    limits = EpisodeLimits(max_turns=3, max_turn_tokens=4, context=200, step_timeout_s=0.05)
    episodes = play(engine, limits, lambda row: SlowEnv(0.5 if row["prompt"] == "p0" else 0.0, False))
    assert [e.stop_reason for e in episodes[:2]] == [STEP_TIMEOUT] * 2 and episodes[2].stop_reason != STEP_TIMEOUT
    limits = EpisodeLimits(max_turns=3, max_turn_tokens=4, context=200, episode_timeout_s=0.1)
    episodes = play(engine, limits, lambda row: AsyncSlowEnv(5.0 if row["prompt"] == "p1" else 0.0, True))
    assert [e.stop_reason for e in episodes[2:]] == [EPISODE_TIMEOUT] * 2 and episodes[0].stop_reason != EPISODE_TIMEOUT
    assert time.perf_counter() - start < 1.5  # the sleeping thread is abandoned, not waited for


def test_episodes_run_concurrently_so_environments_do_not_serialize():
    engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id, eos_rate=0.0)
    start = time.perf_counter()
    play(engine, EpisodeLimits(max_turns=3, max_turn_tokens=2, context=200), lambda r: AsyncSlowEnv(0.1, True), rows=8)
    assert time.perf_counter() - start < 0.6  # 8 episodes x 2 steps x 0.1 s would take 1.6 s one after another


class ExitsOrMisconfigured(ScriptedEnv):
    def step(self, turn):
        raise SystemExit(0)  # sys.exit() in an environment: its episode fails, the run goes on


def test_sys_exit_in_an_environment_fails_its_episode_and_a_user_error_in_make_env_ends_the_run():
    engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id)
    episodes = play(
        engine, EpisodeLimits(max_turns=2, max_turn_tokens=4, context=200), lambda r: ExitsOrMisconfigured()
    )
    assert {e.stop_reason for e in episodes} == {ENV_ERROR} and {e.error_type for e in episodes} == {"SystemExit"}
    assert "step() raised SystemExit: 0 (" in episodes[0].error and "test_episode_runner.py:" in episodes[0].error

    def misconfigured(row):
        raise PluginError("tool 'f': no JSON schema can be built")

    with pytest.raises(PluginError, match="no JSON schema"):
        play(engine, EpisodeLimits(max_turns=2, max_turn_tokens=4, context=200), misconfigured)
