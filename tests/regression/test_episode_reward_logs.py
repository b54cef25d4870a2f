"""A reward's ``log_metric`` / ``log_extra`` reach the batch of an episode task, as they do for a
single-turn one (they were dropped: ``environments/rollout.py`` never passed ``scorer.last_logs`` on)."""

from __future__ import annotations

from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import RolloutGenerator, Sampling
from tests.helpers.episodes import FakeEngine, ScriptedEnv, chatml_tokenizer


def turns_logged(prompts, completions, num_turns, log_metric, log_extra, **_):
    log_metric("mean_turns", sum(num_turns) / len(num_turns))
    log_extra("turns_seen", list(num_turns))
    return [0.0] * len(completions)


def test_log_metric_and_log_extra_arrive_in_an_episode_batch():
    tokenizer = chatml_tokenizer()
    gen = RolloutGenerator(
        engine=FakeEngine(len(tokenizer), tokenizer.eos_token_id),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names(
            {"environment": 1.0, "turns_logged": 1.0}, functions={"turns_logged": turns_logged}
        ),
        num_generations=2,
        sampling=Sampling(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=0),
    )
    limits = EpisodeLimits(max_turns=3, max_turn_tokens=5, context=300)
    gen.episodes = EpisodeRollout(lambda row: ScriptedEnv(turns=2), limits, ChatRenderer(tokenizer))
    batch = gen.generate([{"prompt": "a"}, {"prompt": "b"}], step=0, rank=0)
    turns = [e.num_turns for e in gen.episodes.last_episodes]
    assert batch.reward_extra == {"turns_seen": turns}
    assert batch.reward_metrics == {"reward/mean_turns": sum(turns) / len(turns)}
