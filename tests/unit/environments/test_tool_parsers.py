"""Tool-call parsers: malformed JSON, wrong shapes, several calls and a call cut by the length
limit give error messages, never exceptions; random text never raises; the choice is explained."""

from __future__ import annotations

import json
import random

import pytest

from grpo_lightning.environments.base import TOOL_PARSERS
from grpo_lightning.environments.parsers import choose_tool_parser
from grpo_lightning.errors import ConfigError

hermes, xml, llama = TOOL_PARSERS["hermes"], TOOL_PARSERS["qwen3_coder"], TOOL_PARSERS["llama3_json"]


def tc(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def xml_call(name: str, **params: str) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


def test_hermes_reads_several_calls_and_ignores_surrounding_text():
    text = "Let me look.\n" + tc('{"name": "lookup", "arguments": {"key": "a"}}') + tc('{"name": "f", "arguments": {}}')
    assert hermes(text) == ([{"name": "lookup", "arguments": {"key": "a"}}, {"name": "f", "arguments": {}}], [])


def test_hermes_accepts_arguments_given_as_a_json_string():
    assert hermes(tc('{"name": "f", "arguments": "{\\"x\\": 1}"}'))[0] == [{"name": "f", "arguments": {"x": 1}}]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (tc('{"name": "f", "arguments": {"x": 1}'), "not valid JSON"),
        (tc('["f"]'), 'string "name"'),
        (tc('{"arguments": {}}'), 'string "name"'),
        (tc('{"name": "f", "arguments": [1, 2]}'), "must be a JSON object"),
        (tc('{"name": "f", "arguments": "{oops"}'), "are not valid JSON"),
        ('<tool_call>\n{"name": "lookup", "argum', "cut off"),
    ],
)
def test_hermes_malformed_calls_are_errors_not_exceptions(text, says):
    calls, errors = hermes(text)
    assert calls == [] and len(errors) == 1 and says in errors[0]


def test_a_good_call_before_a_cut_one_is_kept():
    calls, errors = hermes(tc('{"name": "f", "arguments": {}}') + '<tool_call>{"name": "g"')
    assert calls == [{"name": "f", "arguments": {}}] and "cut off" in errors[0]


def test_qwen3_coder_xml_calls_keep_values_as_text_marked_untyped():
    text = "ok\n" + xml_call("add", x="40", y="2") + xml_call("lookup", key="two\nlines")
    calls, errors = xml(text)
    assert errors == []
    assert calls == [
        {"name": "add", "arguments": {"x": "40", "y": "2"}, "typed": False},
        {"name": "lookup", "arguments": {"key": "two\nlines"}, "typed": False},
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<tool_call>\n<parameter=x>1</parameter>\n</tool_call>", "exactly one <function=NAME>"),
        ("<tool_call>\n<function=f>\nstray <parameter=x>1</parameter></function>\n</tool_call>", "outside <parameter"),
        ("<tool_call>\n<function=f>\n<parameter=x>\n1", "cut off"),
    ],
)
def test_qwen3_coder_malformed_calls_are_errors(text, says):
    calls, errors = xml(text)
    assert calls == [] and says in errors[0]


def test_llama3_json_reads_one_or_several_calls_and_plain_answers():
    assert llama("The answer is 4.") == ([], [])
    one = '<|python_tag|>{"name": "f", "parameters": {"s": "a;b}"}}'
    assert llama(one) == ([{"name": "f", "arguments": {"s": "a;b}"}}], [])
    two = '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": "\\"q\\";"}}'
    assert [c["name"] for c in llama(two)[0]] == ["f", "g"]
    calls, errors = llama('{"name": "f", "parameters": {"x": ')
    assert calls == [] and "not valid JSON" in errors[0]


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder", "llama3_json"])
def test_no_text_makes_a_parser_raise(name):
    rng = random.Random(name)
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "<function=f>",
        "</function>",
        "<parameter=x>",
        "</parameter>",
        "{",
        "}",
        '"name"',
        ":",
        '"f"',
        '"arguments"',
        "[",
        "]",
        ";",
        "\n",
        "\\",
        '"',
        "<|python_tag|>",
        "1",
        "x",
    ]
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 20)))
        calls, errors = TOOL_PARSERS[name](text)
        assert all(isinstance(c["name"], str) and isinstance(c["arguments"], dict) for c in calls)
        assert all(isinstance(e, str) for e in errors)
        json.dumps(calls)


def test_the_parser_is_chosen_from_the_template_then_the_name_and_says_why():
    assert choose_tool_parser("auto", "x", "{{ '<tool_call>\\n<function=' }}")[0] == "qwen3_coder"
    assert choose_tool_parser("auto", "x", "{{ '<tool_call>' }}")[0] == "hermes"
    assert choose_tool_parser("auto", "meta-llama/Llama-3.2-1B-Instruct", "no markup")[0] == "llama3_json"
    name, line = choose_tool_parser("auto", "smollm2", None)
    assert name == "hermes" and "set task.tool_parser" in line
    assert choose_tool_parser("llama3_json", "qwen", "<tool_call>") == (
        "llama3_json",
        "tool-call parser: llama3_json (configured)",
    )
    with pytest.raises(ConfigError, match="did you mean 'hermes'"):
        choose_tool_parser("hermez")
