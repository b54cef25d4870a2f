"""What an environment's reset/step may return (issue 46): the rules of reward functions' values,
one error naming the environment, the method and the field; good returns pass untouched."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_lightning.environments.base import Reset, Step
from grpo_lightning.environments.episode import EpisodeRunner
from grpo_lightning.environments.limits import DONE, EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.returns import EnvironmentReturnError, checked
from grpo_lightning.errors import UserError
from grpo_lightning.rollout.engine import Sampling
from tests.helpers.episodes import FakeEngine, chatml_tokenizer

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("method", "value", "says"),
    [
        ("step", Step(messages=[{"role": "bogus", "content": "x"}]), "step().messages[0] has role 'bogus'"),
        ("step", Step(messages=[{"role": "user", "content": 3}]), "content must be a string, got a int"),
        ("step", Step(messages="not a list"), "step().messages must be a list of chat messages, got a str"),
        ("step", Step(messages=["hi"]), "messages[0] must be a dict"),
        ("step", Step(messages=[USER], reward="1.0"), "step().reward must be a number or None"),
        ("step", Step(messages=[USER], reward=[1.0]), "got a list"),
        ("step", Step(messages=[USER], reward=math.nan), "non-finite"),
        ("step", Step(messages=[USER], done="yes"), "step().done must be True or False"),
        ("step", Step(messages=[USER], info=None), "step().info must be a dict"),
        ("step", {"messages": [USER]}, "must return a grpo_lightning.environments.Step, got a dict"),
        ("step", None, "got a NoneType"),
        ("reset", Reset(messages=[]), "reset().messages is empty"),
        ("reset", Reset(messages=[{"content": "x"}]), "has role None"),
        ("reset", Reset(messages=[USER], tools={"name": "f"}), "reset().tools must be a list"),
        ("reset", Step(messages=[USER]), "must return a grpo_lightning.environments.Reset, got a Step"),
    ],
)
def test_a_bad_return_is_one_error_naming_the_environment(method, value, says):
    with pytest.raises(EnvironmentReturnError) as refused:
        checked("my_env", method, value)
    message = str(refused.value)
    assert isinstance(refused.value, UserError) and len(message.splitlines()) == 1
    assert message.startswith("environment 'my_env': ") and says in message, message
    assert f"fix what its {method}() returns" in message


@pytest.mark.parametrize(
    "value",
    [
        Step(),
        Step(messages=[USER, {"role": "tool", "content": "42", "name": "f"}], reward=1, done=True),
        Step(messages=[USER], reward=np.float32(0.5), done=np.bool_(True), info={"k": 1}),
        Step(messages=[USER], reward=True),  # a bool is a reward (0 or 1), as for reward functions
    ],
)
def test_good_step_returns_pass_unchanged(value):
    assert checked("my_env", "step", value) is value


def test_good_reset_returns_pass_unchanged():
    reset = Reset(messages=[{"role": "system", "content": "s"}, USER], tools=[{"type": "function"}])
    assert checked("my_env", "reset", reset) is reset


class StringReward:
    def reset(self, seed, row):
        return Reset(messages=[USER])

    def step(self, turn):
        return Step(messages=[USER], reward="1.0", done=True)

    def close(self):
        pass


def test_the_runner_ends_on_a_bad_return_instead_of_failing_the_episode():
    tokenizer = chatml_tokenizer()
    engine = FakeEngine(len(tokenizer), tokenizer.eos_token_id)
    sampling = Sampling(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0)
    limits = EpisodeLimits(max_turns=2, max_turn_tokens=4, context=200)
    runner = EpisodeRunner(
        engine, ChatRenderer(tokenizer), lambda row: StringReward(), limits, sampling, env_name="strs"
    )
    with pytest.raises(EnvironmentReturnError, match=r"environment 'strs': step\(\).reward .* got a str: '1.0'"):
        runner.run([{"prompt": "p"}] * 2, [0, 0], [1, 2])
    good = EpisodeRunner(engine, ChatRenderer(tokenizer), lambda row: StringReward(), limits, sampling)
    good.make_env = lambda row: type(
        "Fine", (StringReward,), {"step": lambda self, turn: Step(reward=1.0, done=True)}
    )()
    assert [e.stop_reason for e in good.run([{"prompt": "p"}], [0], [1])] == [DONE]
