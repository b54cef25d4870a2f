"""Start-up chat-template checks on hand-written copies of real families' templates and toy quirks:
tools rendered or not, token-in/token-out ids equal to a full render or each difference named."""

from __future__ import annotations

import asyncio
import random
import string
import warnings

import pytest
from helpers.chat_templates import FAMILIES, tokenizer_for

from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.template_checks import (
    CHATML_TOOLS,
    TemplateReport,
    ToolsInSystemPrompt,
    check_chat_template,
    compare_with_render,
    resolve_chat_template,
    startup_report,
    warn_once,
)
from grpo_lightning.environments.tools import ToolEnvironment
from grpo_lightning.tasks.key_lookup import KeyLookupTaskConfig, key_lookup, key_lookup_env


def lookup(key: str) -> str:
    """The value stored under a key.

    Args:
        key: the key
    """
    return key.upper()


TOOLS = ToolEnvironment([lookup]).schemas


def check(name: str, template: str | None = None) -> TemplateReport:
    return check_chat_template(ChatRenderer(tokenizer_for(name), chat_template=template), TOOLS)


def test_qwen25_renders_the_tools_and_accumulates_to_a_full_render():
    report = check("qwen2.5")
    assert report.renders_tools and report.prefix_preserving and report.problems == []
    assert report.lines() == [
        "chat template: renders the tools",
        "chat template: each turn extends the last as a prefix",
    ]


def test_qwen3_names_the_added_and_the_dropped_think_blocks():
    report = check("qwen3")
    assert report.renders_tools and not report.prefix_preserving and len(report.problems) == 2
    assert "adds a <think></think> block the model did not sample" in report.problems[0]
    assert "drops the <think> blocks of earlier turns" in report.problems[1]


def test_llama3_names_the_stripped_whitespace():
    report = check("llama3")
    assert report.renders_tools and len(report.problems) == 1
    assert "strips whitespace around message contents" in report.problems[0]


def test_smollm2_ignores_tools_and_the_shipped_template_fixes_it():
    report = check("smollm2")
    assert report.renders_tools is False and report.missing_tools == ["lookup"]
    assert "chat_template_override=chatml_tools" in report.lines()[0]
    fixed = check("smollm2", resolve_chat_template("chatml_tools"))
    assert fixed.renders_tools and fixed.prefix_preserving
    assert resolve_chat_template("chatml_tools") == CHATML_TOOLS and resolve_chat_template("{{ x }}") == "{{ x }}"


def test_a_close_before_the_stop_token_is_named_as_text_the_model_does_not_sample():
    report = check("boundary_newline")
    assert len(report.problems) == 2 and all("text before <|im_end|>" in p for p in report.problems)
    assert all("right after the sampled stop token" in p for p in report.problems)


def test_a_template_that_rewrites_its_start_is_not_prefix_preserving():
    report = check("counting")
    assert len(report.problems) == 2 and "'1 messages" in report.problems[0] and "'4 messages" in report.problems[0]


def test_no_tools_offered_is_said_and_not_checked():
    report = check_chat_template(ChatRenderer(tokenizer_for("qwen2.5")))
    assert report.renders_tools is None and report.lines()[0] == "chat template: no tools offered"


@pytest.mark.parametrize("family", ["qwen2.5", "smollm2", "chatml_tools"])
def test_random_episodes_accumulate_to_the_full_render(family):
    """Property: any sampled texts (whitespace and markup included) and replies give the full render's ids."""
    template = CHATML_TOOLS if family == "chatml_tools" else None
    renderer = ChatRenderer(tokenizer_for("smollm2" if family == "chatml_tools" else family), chat_template=template)
    rng = random.Random(family)
    alphabet = string.ascii_letters + string.digits + " \n\t.,{}<>/\"'"

    def text():
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) + rng.choice(["", "<tool_call>", " x"])

    for _ in range(25):
        turns = []
        for _ in range(rng.randint(1, 4)):
            role = rng.choice(["tool", "user"])
            reply = [{"role": role, "content": text() or "r"} for _ in range(rng.randint(1, 2))]
            turns.append((text() or "a", reply))
        turns[-1] = (turns[-1][0], [])
        assert compare_with_render(renderer, [{"role": "user", "content": text() or "q"}], turns, TOOLS) == ""


def test_each_problem_is_warned_once():
    report = TemplateReport(renders_tools=True, problems=["unique problem for this test"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_once(report) == ["unique problem for this test"]
        assert warn_once(report) == []
    assert len(caught) == 1 and "keeps the sampled ids" in str(caught[0].message)


def test_tools_in_the_system_prompt_reach_a_template_that_ignores_tools():
    env = ToolsInSystemPrompt(ToolEnvironment([lookup]), parser="hermes")
    reset = asyncio.run(
        env.reset(0, {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]})
    )
    assert reset.tools == [] and reset.info["tools_in_system_prompt"]
    assert reset.messages[0]["content"].startswith("Be brief.\n\nYou can call these tools:")
    text = ChatRenderer(tokenizer_for("smollm2")).render(reset.messages, None, True)
    assert '"name": "lookup"' in text and "<tool_call>" in text
    bare = asyncio.run(ToolsInSystemPrompt(ToolEnvironment([lookup]), parser="llama3_json").reset(0, {"prompt": "q"}))
    assert bare.messages[0]["role"] == "system" and '"parameters"' in bare.messages[0]["content"]


def test_every_family_fixture_is_checked():
    assert set(FAMILIES) == {"qwen2.5", "qwen3", "llama3", "smollm2"}


def test_the_startup_report_names_the_parser_and_the_template_verdict():
    options = KeyLookupTaskConfig(tools_in_system_prompt=False)
    row = key_lookup(options)[0][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parser, lines = startup_report(
            ChatRenderer(tokenizer_for("smollm2")), lambda r: key_lookup_env(options, r), row, "auto", "SmolLM2-135M"
        )
        assert parser == "hermes" and "neither the chat template nor the model name" in lines[0]
        assert "does not render the tools (lookup missing" in lines[1]
        parser, lines = startup_report(
            ChatRenderer(tokenizer_for("qwen2.5")), lambda r: key_lookup_env(options, r), row, "auto", "x"
        )
    assert parser == "hermes" and lines == [
        "tool-call parser: hermes (the chat template emits <tool_call>)",
        "chat template: renders the tools",
        "chat template: each turn extends the last as a prefix",
    ]
