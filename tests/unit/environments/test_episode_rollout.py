"""Episodes as a generation batch: the generator's hook, rewards TRL-style, failures kept and counted."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.environments.base import REWARD_AGGREGATORS, Turn
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.rollout import METRICS, EpisodeRollout
from grpo_lightning.rewards import RewardScorer, register_reward
from grpo_lightning.rollout import RolloutGenerator, Sampling
from grpo_lightning.step.micro_batches import micro_batches
from grpo_lightning.tasks.guess_number import FOUND, HIGHER, LOWER, GuessNumberEnv, read_guess
from tests.helpers.episodes import FakeEngine, ScriptedEnv, chatml_tokenizer

SEEN: dict[str, list] = {}


@register_reward("test_episode_turns")
def turns_reward(prompts, completions, messages, env_reward, info, stop_reason, num_turns, completion_ids, **_):
    SEEN.update(prompts=prompts, completions=completions, messages=messages, env_reward=env_reward, info=info)
    return [0.1 * n for n in num_turns]


def generator(make_env, rewards, failed_reward=-1.0):
    tokenizer = chatml_tokenizer()
    gen = RolloutGenerator(
        engine=FakeEngine(len(tokenizer), tokenizer.eos_token_id),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names(rewards),
        num_generations=2,
        sampling=Sampling(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0),
        seed=3,
    )
    limits = EpisodeLimits(max_turns=4, max_turn_tokens=6, context=300)
    gen.episodes = EpisodeRollout(make_env, limits, ChatRenderer(tokenizer), failed_reward=failed_reward)
    return gen


def test_a_step_of_episodes_is_a_scored_batch_with_masks_and_failures_kept():
    gen = generator(
        lambda row: ScriptedEnv(turns=3, fail_at=1 if row["prompt"] == "bad" else None),
        {"environment": 1.0, "test_episode_turns": 1.0},
    )
    batch = gen.generate([{"prompt": "good", "answer": "1"}, {"prompt": "bad", "answer": "2"}], step=5, rank=0)
    episodes = gen.episodes.last_episodes
    assert batch.num_sequences == 4 and batch.max_new_tokens == 24 and batch.episode_ids.tolist() == [0, 1, 2, 3]
    assert batch.loss_mask[2:].sum() == 0 and batch.loss_mask[:2].sum() == sum(e.sampled_tokens for e in episodes[:2])
    assert batch.rewards[2:].tolist() == [-1.0, -1.0]  # failed: the configured reward, still in the group
    assert batch.rewards[:2].tolist() == pytest.approx([3.3, 3.3])  # three steps of reward 1 (sum) + 0.1 per turn
    assert batch.timing[METRICS + "failed"] == 2 and batch.timing[METRICS + "stop/done"] == 2
    assert batch.timing[METRICS + "stop/env_error"] == 2 and batch.timing[METRICS + "turns"] == 2.0
    assert batch.turn_ids.shape == batch.completion_ids.shape and batch.finished.tolist() == [True, True, False, False]
    on = batch.loss_mask[:2].bool()  # (a failed episode keeps its sampled ids' log-probs, under mask 0)
    assert torch.equal(batch.engine_logprobs[:2][~on], torch.zeros(int((~on).sum())))
    assert SEEN["prompts"][0][0]["role"] == "user" and SEEN["completions"][0][0]["role"] == "assistant"
    assert SEEN["messages"][0][: len(SEEN["prompts"][0])] == SEEN["prompts"][0] and SEEN["env_reward"][0] == 3.0
    assert episodes[0].reset_seed == episodes[1].reset_seed != episodes[2].reset_seed


def test_aggregators():
    assert REWARD_AGGREGATORS["sum"]([1.0, 2.0], 2.0) == 3.0
    assert REWARD_AGGREGATORS["mean"]([1.0, 2.0], 2.0) == 1.5 and REWARD_AGGREGATORS["mean"]([], None) == 0.0
    assert REWARD_AGGREGATORS["final"]([1.0, 2.0], 2.0) == 2.0 and REWARD_AGGREGATORS["final"]([1.0], None) == 0.0


def test_guess_number_answers_higher_lower_and_rewards_fewer_turns():
    env = GuessNumberEnv(max_number=8, turn_cost=0.1)
    first = env.reset(seed=11, row={})
    assert first.messages == GuessNumberEnv().reset(seed=11, row={}).messages  # same seed, same game
    secret = env.secret
    replies = []
    for guess in range(1, secret + 1):
        step = env.step(Turn(text=f" {guess}", token_ids=[]))
        replies.append(step.messages[0]["content"])
    assert replies == [HIGHER] * (secret - 1) + [FOUND] and step.done
    assert step.reward == max(0.0, 1 - 0.1 * (secret - 1))
    env.reset(seed=11, row={})
    assert env.step(Turn(text="9", token_ids=[])).messages[0]["content"] == LOWER
    assert read_guess("=+") is None and read_guess("12 5") == 12


@pytest.mark.parametrize("where", ["make", "reset"])
def test_an_episode_failed_before_its_prompt_still_trains_with_its_group(where):
    """An environment that cannot be made, or whose reset raises (a server that did not answer),
    leaves its episode without a prompt: the row gets one prompt token, so the training passes can
    pack it, and nothing of it is trained (seen in CI: the step raised in pack_micro_batch)."""

    class ResetFails(ScriptedEnv):
        def reset(self, seed, row):
            raise RuntimeError("the server did not answer")

    def make_env(row):
        if row["prompt"] == "bad":
            if where == "make":
                raise ConnectionError("no server")
            return ResetFails()
        return ScriptedEnv(turns=2)

    gen = generator(make_env, {"environment": 1.0})
    batch = gen.generate([{"prompt": "good", "answer": "1"}, {"prompt": "bad", "answer": "2"}], step=1, rank=0)
    assert [e.stop_reason for e in gen.episodes.last_episodes] == ["done", "done", "env_error", "env_error"]
    assert bool((batch.prompt_mask.sum(dim=1) >= 1).all())
    assert batch.completion_mask[2:].sum() == 0 and batch.loss_mask[2:].sum() == 0
    assert batch.rewards[2:].tolist() == [-1.0, -1.0]
    (mb,) = micro_batches(batch, batch.num_sequences)
    packed = mb.packed  # raised before: a sequence with no prompt token
    assert packed.targets.numel() == int(batch.completion_mask[:2].sum())
