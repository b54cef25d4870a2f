"""Tool-call parsers: malformed JSON, wrong shapes, several calls and a call cut by the length
limit give error messages, never exceptions; random text never raises; the choice is explained."""

from __future__ import annotations

import json
import random

import pytest

from grpo_lightning.environments.base import TOOL_PARSERS
from grpo_lightning.environments.parsers import choose_tool_parser
from grpo_lightning.environments.parsers.common import MAX_DEPTH, nesting_depth
from grpo_lightning.environments.tools import coerce
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


def depth_of(value) -> int:
    """The nesting depth of decoded JSON, iteratively (the very thing must not recurse)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def nested(rng: random.Random, depth: int) -> str:
    """JSON nested ``depth`` levels of random lists and objects, closed or cut short at random."""
    opens = [rng.choice(["[", '{"k": ']) for _ in range(depth)]
    inner = rng.choice(["1", '"s"', "[]", "{}", "", '"\\"'])
    closes = ["]" if o == "[" else "}" for o in reversed(opens)]
    if rng.random() < 0.3:
        closes = closes[: rng.randint(0, len(closes))]
    return "".join(opens) + inner + "".join(closes)


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder", "llama3_json"])
def test_deeply_nested_or_malformed_json_never_makes_a_parser_raise(name):
    """Property (issue 46): nested thousands of levels deep, hermes raised RecursionError. Every parser
    answers with errors, and what it does return is shallow enough to walk, dump and validate."""
    rng = random.Random(f"deep-{name}")
    for case in range(200):
        depth = rng.choice([1, 5, MAX_DEPTH - 2, MAX_DEPTH + 1, 500, 1200, 5000, rng.randint(1, 20_000)])
        arguments = nested(rng, depth)
        wrap = rng.choice(
            [
                lambda a: tc(f'{{"name": "f", "arguments": {a}}}'),
                lambda a: tc(f'{{"name": "f", "arguments": {json.dumps(a)}}}'),  # arguments as a JSON string
                lambda a: tc(a),
                lambda a: f'{{"name": "f", "parameters": {a}}}',
                lambda a: f'<|python_tag|>{{"name": "f", "parameters": {a}}}; {a}',
                lambda a: xml_call("f", x=a),
                lambda a: a,
            ]
        )
        text = wrap(arguments)
        calls, errors = TOOL_PARSERS[name](text)
        assert all(isinstance(e, str) and len(e.splitlines()) >= 1 for e in errors), case
        for call in calls:
            assert isinstance(call["arguments"], dict) and depth_of(call["arguments"]) <= MAX_DEPTH + 1, case
            json.dumps(call)
            coerce(call["arguments"], {"properties": {"x": {"type": "object"}}})  # qwen3_coder's strings decoded
    deep = tc('{"name": "f", "arguments": ' + "[" * 3000 + "]" * 3000 + "}")
    assert hermes(deep)[0] == [] and "nested 3001 levels deep" in hermes(deep)[1][0]


def test_nesting_depth_ignores_brackets_inside_strings():
    assert nesting_depth('{"a": "[[[{{{", "b": [1, {"c": "\\"}]}') == 3
    assert nesting_depth(r'"\\"[') == 1 and nesting_depth(r'"\"[') == 0 and nesting_depth("]]]") == 0


def test_a_deeply_nested_string_argument_is_left_for_validation_not_decoded():
    deep = "[" * 5000 + "]" * 5000
    assert coerce({"x": deep}, {"properties": {"x": {"type": "array"}}}) == {"x": deep}
    assert coerce({"x": "[1, 2]"}, {"properties": {"x": {"type": "array"}}}) == {"x": [1, 2]}


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
