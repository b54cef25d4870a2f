"""The tool environment: schemas from functions, every tool error a counted tool message (never an
exception), the per-turn limits, and time limits that stop or abandon a call as documented."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from helpers.tool_functions import spin

from grpo_lightning.environments.base import Turn
from grpo_lightning.environments.tools import Tool, ToolEnvironment, ToolLimits, tool_schema
from grpo_lightning.errors import PluginError


def lookup(key: str) -> str:
    """The value stored under a key.

    Args:
        key: the key
    """
    return {"a": "apple", "b": "banana"}[key]


def add(x: int, y: int = 1) -> int:
    """Add two numbers.

    Args:
        x: first
        y: second
    """
    return x + y


def shout(text: str) -> str:
    """Repeat the text many times.

    Args:
        text: what to repeat
    """
    return text * 100


def leave(code: int) -> int:
    """Exit the process.

    Args:
        code: the exit code
    """
    raise SystemExit(code)


def run_turn(env, calls=(), errors=(), text="calling"):
    return asyncio.run(env.step(Turn(text=text, token_ids=[1], tool_calls=list(calls), parse_errors=list(errors))))


def make_env(**kwargs):
    env = ToolEnvironment([lookup, add, shout, leave], **kwargs)
    env.reset(0, {"prompt": "find a"})
    return env


def test_schema_comes_from_hints_and_docstring():
    schema = tool_schema(add)
    assert schema["function"]["name"] == "add"
    assert schema["function"]["parameters"]["properties"]["x"] == {"type": "integer", "description": "first"}
    assert schema["function"]["parameters"]["required"] == ["x"]
    assert "return" not in schema["function"]


def test_a_function_without_docstring_is_a_plugin_error_naming_it():
    def bare(x):
        return x

    with pytest.raises(PluginError, match="'bare'.*docstring"):
        tool_schema(bare)


def test_reset_offers_the_schemas_and_the_prompt():
    env = ToolEnvironment([lookup])
    reset = env.reset(3, {"prompt": "hi"})
    assert reset.messages == [{"role": "user", "content": "hi"}]
    assert [t["function"]["name"] for t in reset.tools] == ["lookup"]


def test_a_good_call_returns_its_output_as_a_tool_message():
    step = run_turn(make_env(), [{"name": "lookup", "arguments": {"key": "a"}, "id": "c1"}])
    assert step.messages == [{"role": "tool", "content": "apple", "name": "lookup", "tool_call_id": "c1"}]
    assert not step.done and step.info["tool_calls"] == 1 and step.info["tool_errors"] == 0


@pytest.mark.parametrize(
    ("call", "kind", "says"),
    [
        ({"name": "nope", "arguments": {}}, "unknown_tool", "unknown tool 'nope'"),
        ({"name": "add", "arguments": {"x": "three"}}, "bad_arguments", "x: 'three' is not of type 'integer'"),
        ({"name": "add", "arguments": {}}, "bad_arguments", "'x' is a required property"),
        ({"name": "add", "arguments": {"x": 1, "z": 2}}, "bad_arguments", "'z' was unexpected"),
        ({"name": "lookup", "arguments": {"key": "zzz"}}, "exception", "KeyError"),
        ({"name": "leave", "arguments": {"code": 3}}, "exception", "SystemExit: 3"),  # sys.exit() in a tool
    ],
)
def test_every_tool_error_is_a_counted_message_never_an_exception(call, kind, says):
    step = run_turn(make_env(), [call])
    assert len(step.messages) == 1 and step.messages[0]["role"] == "tool"
    assert step.messages[0]["content"].startswith("Error: ") and says in step.messages[0]["content"]
    assert step.info["tool_error_kinds"] == {kind: 1} and step.info["tool_errors"] == 1 and not step.done


def test_parse_errors_become_tool_messages_and_counts():
    step = run_turn(make_env(), [{"name": "add", "arguments": {"x": 1}}], ["not valid JSON"])
    assert [m["content"] for m in step.messages] == ["Error: not valid JSON", "2"]
    assert step.info["parse_errors"] == 1 and step.info["tool_calls"] == 1


def test_string_values_from_untyped_parsers_are_coerced_to_the_schema():
    step = run_turn(make_env(), [{"name": "add", "arguments": {"x": "40", "y": "2"}, "typed": False}])
    assert step.messages[0]["content"] == "42"


def test_calls_beyond_the_per_turn_limit_are_refused_not_run():
    env = make_env(limits=ToolLimits(max_calls_per_turn=2))
    step = run_turn(env, [{"name": "add", "arguments": {"x": i}} for i in range(5)])
    assert [m["content"] for m in step.messages[:2]] == ["1", "2"]
    assert all("at most 2 tool calls" in m["content"] for m in step.messages[2:]) and len(step.messages) == 5
    assert step.info["tool_calls"] == 2 and step.info["tool_error_kinds"] == {"too_many_calls": 3}


@pytest.mark.parametrize("overflow", ["truncate", "drop", "end"])
def test_long_outputs_are_truncated_dropped_or_end_the_episode(overflow):
    env = make_env(limits=ToolLimits(max_output_tokens=10, output_overflow=overflow))
    step = run_turn(env, [{"name": "shout", "arguments": {"text": "ab"}}])
    content = step.messages[0]["content"]
    assert step.info["tool_error_kinds"] == {"output_too_long": 1}
    if overflow == "truncate":
        assert content.startswith("abababababa"[:10] + "\n[output truncated: 10 of 200")
    else:
        assert content.startswith("[output dropped: 200")
    assert step.done == (overflow == "end")
    assert step.info.get("stop_reason") == ("tool_output_too_long" if overflow == "end" else None)


def test_outputs_are_counted_in_tokens_with_a_tokenizer(tokenizer):
    env = make_env(limits=ToolLimits(max_output_tokens=5), tokenizer=tokenizer)
    step = run_turn(env, [{"name": "shout", "arguments": {"text": "x"}}])
    assert "[output truncated: 5 of " in step.messages[0]["content"]


def test_a_turn_without_calls_ends_the_episode_with_the_reward():
    env = ToolEnvironment([lookup], reward=lambda text, row: float(row["answer"] in text))
    env.reset(0, {"prompt": "q", "answer": "apple"})
    step = run_turn(env, text="it is apple")
    assert step.done and step.reward == 1.0 and step.info["stop_reason"] == "answer" and step.messages == []


def test_the_environment_can_parse_turns_itself():
    env = make_env(parser="hermes")
    text = '<tool_call>{"name": "lookup", "arguments": {"key": "b"}}</tool_call><tool_call>{bad</tool_call>'
    step = run_turn(env, text=text)
    assert [m["content"][:6] for m in step.messages] == ["Error:", "banana"]
    assert step.info["parse_errors"] == 1 and env.totals["calls"] == 1


def test_a_hung_thread_tool_is_abandoned_within_its_timeout_and_counted():
    release = threading.Event()

    def hang(x: int) -> int:
        """Wait until released.

        Args:
            x: returned
        """
        release.wait()
        return x

    env = ToolEnvironment([Tool(hang, timeout_s=0.2)])
    env.reset(0, {"prompt": "p"})
    start = time.monotonic()
    try:
        step = run_turn(env, [{"name": "hang", "arguments": {"x": 1}}])
    finally:
        release.set()
    assert time.monotonic() - start < 2.0
    assert "did not finish within 0.2 s; it was abandoned" in step.messages[0]["content"]
    assert step.info["abandoned_threads"] == 1 and step.info["tool_error_kinds"] == {"timeout": 1}


def test_an_async_tool_past_its_timeout_is_cancelled():
    async def sleepy(x: int) -> int:
        """Sleep.

        Args:
            x: returned
        """
        await asyncio.sleep(30)
        return x

    env = ToolEnvironment([Tool(sleepy, timeout_s=0.1)])
    env.reset(0, {"prompt": "p"})
    step = run_turn(env, [{"name": "sleepy", "arguments": {"x": 1}}])
    assert "it was cancelled" in step.messages[0]["content"] and step.info["abandoned_threads"] == 0


def test_a_closure_cannot_run_in_a_process_and_says_so():
    def local(x: int) -> int:
        """Local.

        Args:
            x: x
        """
        return x

    with pytest.raises(Exception, match="not importable"):
        ToolEnvironment([Tool(local, isolation="process")])


@pytest.mark.slow
def test_a_while_true_tool_in_a_process_is_killed_within_its_timeout():
    env = ToolEnvironment([Tool(spin, isolation="process", timeout_s=1.0)])
    env.reset(0, {"prompt": "p"})
    worker = env._workers["spin"]._worker
    try:
        worker._start()  # importing the worker's modules is not the call's time
        start = time.monotonic()
        step = run_turn(env, [{"name": "spin", "arguments": {"n": 0}}])
        elapsed = time.monotonic() - start
        assert "did not finish within 1 s; its worker process was killed" in step.messages[0]["content"]
        assert elapsed < 3.0 and step.info["abandoned_threads"] == 0 and step.info["tool_error_kinds"] == {"timeout": 1}
        assert worker._process is None  # killed: nothing left running
    finally:
        env.close()
