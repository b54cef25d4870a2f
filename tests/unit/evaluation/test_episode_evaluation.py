"""Held-out episodes (val/* of episode tasks): the same games at every evaluation, metrics that add up."""

from __future__ import annotations

import random

import pytest

from grpo_lightning.environments.limits import STOP_REASONS, EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.evaluation.episodes import EpisodeEvaluator, row_seed
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import RolloutGenerator, Sampling
from tests.helpers.episodes import FakeEngine, ScriptedEnv, chatml_tokenizer


class SolvedEnv(ScriptedEnv):
    """Reports success in its info when the episode ends by the environment (on an even reset seed)."""

    def reset(self, seed, row):
        self.even = seed % 2 == 0
        return super().reset(seed, row)

    def step(self, turn):
        step = super().step(turn)
        step.info["won"] = step.done and self.even
        return step


def evaluator(rewards=None, max_turns=3, functions=None, **kwargs) -> EpisodeEvaluator:
    tokenizer = chatml_tokenizer()
    gen = RolloutGenerator(
        engine=FakeEngine(len(tokenizer), tokenizer.eos_token_id),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names(rewards or {"environment": 1.0}, functions=functions),
        num_generations=2,
        sampling=Sampling(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=0),
        seed=11,
    )
    limits = EpisodeLimits(max_turns=max_turns, max_turn_tokens=5, context=400)
    gen.episodes = EpisodeRollout(lambda row: SolvedEnv(turns=row["turns"]), limits, ChatRenderer(tokenizer))
    return EpisodeEvaluator(gen, success_info="won", **kwargs)


def rows(n: int, rng: random.Random) -> list[dict]:
    return [{"prompt": f"g{i}", "turns": rng.randint(1, 4)} for i in range(n)]


def test_every_evaluation_plays_the_same_games_whatever_the_step_or_rank():
    ev = evaluator(greedy=False, samples_per_row=3)
    games = rows(4, random.Random(0))
    first = ev.evaluate(games, step=0, rank=0)
    episodes = [(e.reset_seed, e.sample_seed, e.ids) for e in ev.last_episodes]
    assert ev.evaluate(games, step=50, rank=1) == first
    assert [(e.reset_seed, e.sample_seed, e.ids) for e in ev.last_episodes] == episodes
    # one reset seed per row, a sampling seed per episode; the row's own content fixes them
    assert [e.reset_seed for e in ev.last_episodes] == [row_seed(g, -1) for g in games for _ in range(3)]
    assert len({e.sample_seed for e in ev.last_episodes}) == 12
    assert row_seed({"a": 1, "b": 2}, 0) == row_seed({"b": 2, "a": 1}, 0) != row_seed({"a": 1, "b": 2}, 1)


def test_greedy_episodes_ask_the_engine_for_its_most_likely_token():
    ev = evaluator()
    ev.evaluate(rows(2, random.Random(1)))
    assert ev.sampling.top_k == 1 and ev.sampling.max_new_tokens == 5
    assert evaluator(greedy=False).sampling.top_k == 0
    assert evaluator(max_new_tokens=2).sampling.max_new_tokens == 2


@pytest.mark.parametrize("case", range(12))
def test_the_metrics_are_the_means_over_the_held_out_episodes(case):
    """Property: random rows, limits and k; each val/* is recomputed from the episodes themselves."""
    rng = random.Random(case)
    k = rng.choice([1, 2, 3])
    ev = evaluator(max_turns=rng.randint(1, 4), greedy=rng.random() < 0.5, samples_per_row=k)
    games = rows(rng.randint(1, 5), rng)
    metrics = ev.evaluate(games)
    played = ev.last_episodes
    n = len(played)
    assert n == len(games) * k
    assert metrics["val/turns"] == pytest.approx(sum(e.num_turns for e in played) / n)
    assert metrics["val/reward"] == pytest.approx(sum(ev.rollout.episodes.env_reward(e) for e in played) / n)
    won = [bool(e.info.get("won")) for e in played]
    assert metrics["val/success"] == pytest.approx(sum(won) / n)
    assert sum(metrics[f"val/stop/{r}"] for r in STOP_REASONS) == pytest.approx(1.0)
    assert all(won[i] <= (e.stop_reason == "done") for i, e in enumerate(played))
    if k > 1:
        by_row = [any(won[i : i + k]) for i in range(0, n, k)]
        assert metrics[f"val/pass@{k}"] == pytest.approx(sum(by_row) / len(by_row))
        assert metrics[f"val/pass@{k}"] >= metrics["val/success"]
    else:
        assert not any(key.startswith("val/pass@") for key in metrics)


def success_reward(completions, num_turns, **_):
    return [float(n >= 2) for n in num_turns]


def test_a_success_reward_decides_success_in_place_of_the_info():
    rewards = {"environment": 1.0, "two_turns": 0.0}
    ev = evaluator(rewards, functions={"two_turns": success_reward}, success_reward="two_turns", samples_per_row=2)
    metrics = ev.evaluate(rows(6, random.Random(2)))
    assert metrics["val/success"] == pytest.approx(sum(e.num_turns >= 2 for e in ev.last_episodes) / 12)


def test_an_environment_that_never_reports_success_is_said_once():
    ev = evaluator()
    ev.success_info = "never_set"
    with pytest.warns(UserWarning, match=r"info\['never_set'\]"):
        assert ev.evaluate(rows(2, random.Random(3)))["val/success"] == 0.0
    assert ev._warned


def test_a_rollout_replaced_by_another_kind_is_not_evaluated():
    """A VerifiersRollout in place of the runner's (run.rollout.episodes = ...) plays its own way: no val/*,
    said once, instead of failing at the first evaluation (seen in the verifiers integration test)."""
    ev = evaluator()
    ev.rollout.episodes = object()
    assert ev.evaluate(rows(2, random.Random(4))) == {} and ev._warned_replaced
