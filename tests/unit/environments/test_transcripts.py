"""Episodes turn by turn in the run's outputs: each record's turns are the trained ids exactly, the
mask-1 text is what the engine sampled, and tool calls carry their outcome kinds (also as metrics)."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import torch

from grpo_lightning.callbacks.completions_table import completion_rows
from grpo_lightning.callbacks.run_report import RunReport
from grpo_lightning.environments.base import Step, Turn
from grpo_lightning.environments.episode import turn_seed
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.outcomes import outcome_metrics, tool_outcomes
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.rollout import METRICS, EpisodeRollout
from grpo_lightning.environments.tools import ToolEnvironment
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import RolloutGenerator, Sampling
from tests.helpers.episodes import FakeEngine, ScriptedEnv, chatml_tokenizer

TOKENIZER = chatml_tokenizer()


def play(case: int):
    rng = random.Random(case)
    engine = FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id, eos_rate=rng.choice([0.05, 0.2, 0.5]))
    gen = RolloutGenerator(
        engine=engine,
        tokenizer=TOKENIZER,
        scorer=RewardScorer.from_names({"environment": 1.0}),
        num_generations=2,
        sampling=Sampling(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0),
        seed=case,
    )
    limits = EpisodeLimits(max_turns=rng.randint(1, 5), max_turn_tokens=rng.randint(1, 8), context=rng.randint(60, 200))

    def make_env(row):
        return ScriptedEnv(turns=rng.randint(1, 5), fail_at=rng.choice([None, None, 2]), reply_len=8)

    gen.episodes = EpisodeRollout(make_env, limits, ChatRenderer(TOKENIZER), failed_reward=-1.0)
    batch = gen.generate([{"prompt": f"q{i}"} for i in range(3)], step=case, rank=0)
    return engine, gen.episodes, batch


def test_each_turn_is_exactly_the_trained_ids_and_the_mask_1_text_is_what_the_engine_sampled():
    """Property over random limits, turn budgets, stop rates and failures."""
    for case in range(40):
        engine, rollout, batch = play(case)
        episodes = rollout.last_episodes
        assert len(batch.episodes) == len(episodes) == batch.num_sequences
        for row, (episode, record) in enumerate(zip(episodes, batch.episodes, strict=True)):
            turns = record["turns"]
            assert turns[0]["role"] == "prompt" and turns[0]["tokens"] == episode.prompt_ids
            width = int(batch.completion_mask[row].sum())
            trained = batch.loss_mask[row, :width].tolist()
            laid = [t for turn in turns[1:] for t in turn["tokens"]]
            assert laid == batch.completion_ids[row, :width].tolist() == episode.ids
            assert [m for turn in turns[1:] for m in [turn["loss_mask"]] * len(turn["tokens"])] == trained
            sampled = [turn for turn in turns if turn["role"] == "assistant"]
            assert len(sampled) == episode.num_turns  # every model turn sampled at least one id here
            sequence = episode.prompt_ids + laid
            for k, turn in enumerate(sampled):
                seed = turn_seed(episode.sample_seed, k)
                (asked,) = [prompt for prompt, s, _ in engine.requests if s == seed]  # each turn asks once
                out = engine.outputs[(tuple(asked), seed)]
                assert turn["tokens"] == out.token_ids  # what the engine returned, never re-encoded
                assert (
                    sequence[len(asked) : len(asked) + len(out.token_ids)] == out.token_ids
                )  # right after its request
                assert turn["text"] == TOKENIZER.decode(out.token_ids, skip_special_tokens=False)
                assert abs(turn["logprob_sum"] - sum(out.logprobs)) < 1e-9
                assert turn["loss_mask"] == (0 if episode.failed else 1)
            assert all(t["loss_mask"] == 0 for t in turns if t["role"] in ("prompt", "environment"))
            assert record["stop_reason"] == episode.stop_reason and record["num_turns"] == episode.num_turns
            assert record["env_reward"] == rollout.env_reward(episode) and record["reset_seed"] == episode.reset_seed


def test_completions_jsonl_holds_one_record_per_episode_with_its_turns(tmp_path):
    _, rollout, batch = play(3)
    episodes = rollout.last_episodes
    RunReport(tmp_path, max_rows=4).write_samples(batch, torch.zeros(batch.num_sequences))
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    for line, record in zip(lines, batch.episodes, strict=False):
        assert line["turns"] == record["turns"] and line["stop_reason"] == record["stop_reason"]
        assert set(line["turns"][1]) >= {"role", "text", "tokens", "loss_mask"}
    columns, rows = completion_rows(batch, torch.zeros(batch.num_sequences), 2)
    assert columns[-3:] == ["turns", "stop_reason", "num_turns"]
    assert rows[0][-3].startswith("[assistant ") and rows[0][-2] == episodes[0].stop_reason


def lookup(key: str) -> str:
    """The value under a key.

    Args:
        key: the key
    """
    return {"a": "1"}[key]


def test_tool_calls_carry_their_outcome_kinds_and_the_batch_counts_them():
    env = ToolEnvironment([lookup])
    env.reset(0, {"prompt": "q"})
    calls = [
        {"name": "lookup", "arguments": {"key": "a"}},
        {"name": "lookup", "arguments": {"key": "zz"}},
        {"name": "nope", "arguments": {}},
        {"name": "lookup", "arguments": {"k": 1}},
    ]
    step: Step = asyncio.run(env.step(Turn(text="x", token_ids=[1], tool_calls=calls, parse_errors=["bad"])))
    kinds = [o["outcome"] for o in step.info["tool_outcomes"]]
    assert kinds == ["parse", "ok", "exception", "unknown_tool", "bad_arguments"]
    assert step.info["tool_outcomes"][2] == {"name": "lookup", "arguments": {"key": "zz"}, "outcome": "exception"}
    episode = SimpleNamespace(step_infos=[step.info, step.info], info={"close_error": "boom"})
    assert tool_outcomes(episode) == {"calls": 4, "parse": 2, "exception": 2, "unknown_tool": 2, "bad_arguments": 2}
    metrics = outcome_metrics([episode, SimpleNamespace(step_infos=[], info={})])
    assert metrics[METRICS + "tool/exception"] == 1.0 and metrics[METRICS + "tool/ran"] == 2.0
    assert metrics[METRICS + "tool/timeout"] == 0.0 and metrics[METRICS + "close_errors"] == 1.0
