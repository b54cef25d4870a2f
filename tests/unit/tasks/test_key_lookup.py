"""task=key_lookup: the value comes from the reset seed, only a lookup of the right key reveals it,
and only an answer containing it earns the reward."""

from __future__ import annotations

import asyncio

import pytest

from grpo_lightning.environments.base import TOOL_PARSERS, Turn
from grpo_lightning.environments.template_checks import format_call
from grpo_lightning.tasks.key_lookup import KeyLookupTaskConfig, key_lookup, key_lookup_env


def play(env, text, parser="hermes"):
    calls, errors = TOOL_PARSERS[parser](text)
    return asyncio.run(env.step(Turn(text=text, token_ids=[1], tool_calls=calls, parse_errors=errors)))


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder", "llama3_json"])
def test_a_lookup_then_the_value_earns_the_reward(parser):
    options = KeyLookupTaskConfig(tool_parser=parser, call_bonus=0.25)
    train, _ = key_lookup(options)
    env = key_lookup_env(options, train[0])
    reset = env.reset(7, train[0])
    assert (
        reset.tools == []
        and "lookup" in reset.messages[0]["content"]
        and train[0]["key"] in reset.messages[1]["content"]
    )
    step = play(env, format_call(parser, "lookup", {"key": train[0]["key"]}), parser)
    assert step.messages[0]["content"] == reset.info["value"] and not step.done
    final = play(env, f"The value is {reset.info['value']}.", parser)
    assert final.done and final.reward == 1.25 and final.info["correct"]


def test_the_value_is_the_groups_and_a_wrong_key_or_answer_earns_nothing():
    options = KeyLookupTaskConfig(tools_in_system_prompt=False)
    train, val = key_lookup(options)
    assert len(val) == 40 and not {r["key"] for r in train} & {r["key"] for r in val}
    env, other = key_lookup_env(options, train[0]), key_lookup_env(options, train[0])
    reset = env.reset(3, train[0])
    assert reset.tools and other.reset(3, train[0]).info["value"] == reset.info["value"]
    assert other.reset(4, train[0]).info["value"] != reset.info["value"]
    step = play(env, format_call("hermes", "lookup", {"key": "nope-1"}))
    assert "no value is stored under 'nope-1'" in step.messages[0]["content"] and step.info["tool_errors"] == 1
    final = play(env, "I guess 1234.")
    assert final.done and final.reward == 0.0 and not final.info["looked_up"]


def test_bad_options_are_named():
    problems = KeyLookupTaskConfig(tool_parser="hermez", key_style="emoji", question="no key").check_fields("task.")
    assert any("task.tool_parser='hermez'" in p and "hermes" in p for p in problems)
    assert any("task.key_style='emoji'" in p for p in problems) and any("must contain {key}" in p for p in problems)
