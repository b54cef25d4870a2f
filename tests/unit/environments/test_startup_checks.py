"""Start-up checks of an environment: text the tokenizer cannot encode stops the run naming the row,
a runner limit that would end episodes first is warned about; the on_truncated hook gives the reward
a limit would otherwise lose."""

from __future__ import annotations

import pytest

from grpo_lightning.environments.base import Reset
from grpo_lightning.environments.episode import EpisodeRunner
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.returns import EnvironmentReturnError
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.environments.startup_checks import check_first_messages, limit_warnings
from grpo_lightning.environments.template_checks import ToolsInSystemPrompt
from grpo_lightning.errors import DataError
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.rollout import Sampling
from tests.helpers.episodes import FakeEngine, ScriptedEnv, chatml_tokenizer

TINY = ChatRenderer(build_char_tokenizer())


class Says(ScriptedEnv):
    def __init__(self, text: str, **kwargs):
        super().__init__(**kwargs)
        self.text = text

    def reset(self, seed, row):
        return Reset(messages=[{"role": "system", "content": "1+1"}, {"role": "user", "content": self.text}])


def test_text_the_tokenizer_cannot_encode_stops_the_run_naming_the_row_role_and_characters():
    rows = [("training row 0", {}), ("training row 1", {"bad": True})]
    with pytest.raises(DataError) as caught:
        check_first_messages(TINY, lambda row: Says("12 ab?" if row.get("bad") else "12"), rows, "mine")
    message = str(caught.value)
    assert "task.environment=mine: the first messages of training row 1 hold characters ['a', 'b']" in message
    assert "'user' message" in message and "model.tiny.alphabet" in message
    length = check_first_messages(TINY, lambda row: Says("12"), rows[:1], "mine", context=128)
    assert length == len(TINY.prompt_ids(Says("12").reset(0, {}).messages))


def test_a_prompt_that_fills_the_context_is_refused():
    with pytest.raises(DataError, match="no room for a turn"):
        check_first_messages(TINY, lambda row: Says("1" * 40), [("held-out row 0", {})], "mine", context=40)


class Declares(ScriptedEnv):
    max_turns = 10


class DeclaresWithHook(Declares):
    def on_truncated(self, reason):
        return 0.5


def test_a_runner_limit_that_cuts_first_is_named_with_what_it_costs_and_the_fix():
    limits = EpisodeLimits(max_turns=6, max_turn_tokens=16, context=128)
    (turns,) = [w for w in limit_warnings(Declares(), 10, limits) if "plays up to" in w]
    assert "task.max_turns=6 ends its episodes first" in turns and "raise task.max_turns to 10" in turns
    assert "no on_truncated hook" in turns
    context = [w for w in limit_warnings(Declares(), 40, limits) if "the model's context (128)" in w]
    assert context and "6 turns of rollout.max_new_tokens=16 after a 40-token prompt need 136 tokens" in context[0]
    assert all("no on_truncated" not in w for w in limit_warnings(DeclaresWithHook(), 40, limits))
    assert limit_warnings(ScriptedEnv(), 10, EpisodeLimits(max_turns=6, max_turn_tokens=3, context=128)) == []
    total = limit_warnings(ScriptedEnv(), 10, EpisodeLimits(max_turns=4, max_turn_tokens=8, max_total_tokens=30))
    assert len(total) == 1 and "task.max_total_tokens (30)" in total[0]
    wrapped = ToolsInSystemPrompt(DeclaresWithHook())  # the wrapper shows the wrapped one's members
    assert wrapped.max_turns == 10 and wrapped.on_truncated("max_turns") == 0.5


class Partial(ScriptedEnv):
    """Scores only at the end (a game's partial credit); reports it when a limit cuts it."""

    def __init__(self, fail: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.asked, self.fail = [], fail

    def on_truncated(self, reason):
        self.asked.append(reason)
        if self.fail:
            raise RuntimeError("cannot score")
        return 0.25 * self.count


def play(env: Partial, max_turns: int):
    tokenizer = chatml_tokenizer()
    runner = EpisodeRunner(
        FakeEngine(len(tokenizer), tokenizer.eos_token_id),
        ChatRenderer(tokenizer),
        lambda row: env,
        EpisodeLimits(max_turns=max_turns, max_turn_tokens=4, context=400),
        Sampling(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0),
    )
    (episode,) = runner.run([{"prompt": "p"}], [1], [2])
    return episode


def test_the_on_truncated_hook_rewards_an_episode_a_limit_ended_and_only_that():
    env = Partial(turns=5)
    episode = play(env, max_turns=2)
    assert episode.stop_reason == "max_turns" and env.asked == ["max_turns"]
    assert episode.step_rewards == [1.0, 1.0, 0.5] and episode.info["truncated_reward"] == 0.5
    rollout = EpisodeRollout(lambda row: env, EpisodeLimits(), TINY, aggregator="final")
    assert rollout.env_reward(episode) == 0.5  # lost before: a limit's episode had no final reward
    done = Partial(turns=2)
    assert play(done, max_turns=4).stop_reason == "done" and done.asked == []
    failing = play(Partial(turns=5, fail=True), max_turns=2)
    assert failing.stop_reason == "env_error" and "cannot score" in failing.error


def test_an_on_truncated_reward_that_is_not_a_number_ends_the_run_naming_the_environment():
    class Wrong(Partial):
        def on_truncated(self, reason):
            return "0.5"  # coerced by float() it would pass; refused as a step's reward is

    with pytest.raises(EnvironmentReturnError, match=r"on_truncated\(\) must return a finite number or None"):
        play(Wrong(turns=5), max_turns=2)
