"""The start-up of a task played in an environment: the tool-call parser and the chat template's
verdict are printed before any step; a shipped template is named by its name in the override."""

from __future__ import annotations

import logging
import warnings

import pytest
from helpers.chat_templates import tokenizer_for

from grpo_lightning.environments.base import TOOL_PARSERS
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.environments.template_checks import CHATML_TOOLS, applicable_probes
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.tasks.guess_number import GuessNumberTaskConfig, guess_number
from grpo_lightning.tasks.key_lookup import KeyLookupTaskConfig, key_lookup


def start(options, tokenizer, row, caplog, model_name="SmolLM2-135M-Instruct") -> tuple[EpisodeRollout, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.INFO), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rollout = EpisodeRollout.from_task(options, tokenizer, 8, 512, row, model_name)
    return rollout, [r.getMessage() for r in caplog.records]


def test_a_tool_task_prints_the_parser_and_that_the_template_ignores_the_tools(caplog):
    options = KeyLookupTaskConfig(tools_in_system_prompt=False, tool_parser="auto")
    row = key_lookup(options)[0][0]
    rollout, lines = start(options, tokenizer_for("smollm2"), row, caplog)
    assert any(line.startswith("tool-call parser: hermes (neither the chat template") for line in lines)
    assert any("does not render the tools (lookup missing" in line for line in lines)
    assert rollout.parser is TOOL_PARSERS["hermes"]


def test_naming_the_shipped_template_in_the_override_renders_the_tools(caplog):
    options = KeyLookupTaskConfig(
        tools_in_system_prompt=False, tool_parser="auto", chat_template_override="chatml_tools"
    )
    row = key_lookup(options)[0][0]
    rollout, lines = start(options, tokenizer_for("smollm2"), row, caplog)
    assert rollout.renderer.chat_template == CHATML_TOOLS
    assert "tool-call parser: hermes (the chat template emits <tool_call>)" in lines
    assert (
        "chat template: renders the tools" in lines and "chat template: each turn extends the last as a prefix" in lines
    )


def test_a_configured_parser_wins_and_a_game_without_tools_says_so(caplog):
    options = GuessNumberTaskConfig(tool_parser="llama3_json")
    rollout, lines = start(options, build_char_tokenizer(), guess_number(options)[0][0], caplog, "tiny")
    assert "tool-call parser: llama3_json (configured)" in lines and "chat template: no tools offered" in lines
    assert rollout.parser is TOOL_PARSERS["llama3_json"]


@pytest.mark.parametrize("name, ok", [("auto", True), ("qwen3_coder", True), ("hermez", False)])
def test_the_tool_parser_is_checked_against_the_registry_with_the_closest_match(name, ok):
    problems = [p for p in GuessNumberTaskConfig(tool_parser=name).check_fields("task.") if "tool_parser" in p]
    assert (problems == []) == ok
    if not ok:
        assert len(problems) == 1 and "task.tool_parser='hermez'" in problems[0] and "hermes" in problems[0]


def test_a_game_on_the_tiny_model_starts_without_warnings_that_do_not_apply(caplog):
    """guess_number has no tools and the tiny tokenizer no chat template: no parser, no tool-reply or
    thinking probe (they warned twice on every run), no prefix verdict on plain contents."""
    options = GuessNumberTaskConfig()
    caplog.clear()
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rollout = EpisodeRollout.from_task(options, build_char_tokenizer(), 4, 128, guess_number(options)[0][0], "tiny")
    lines = [r.getMessage() for r in caplog.records]
    assert [str(w.message) for w in caught] == []
    assert rollout.parser is None and lines[0].startswith("tool-call parser: none (the environment offers no tools")
    assert lines[1:] == [
        "chat template: no tools offered",
        "chat template: none (the tokenizer has none: message contents are joined as they are)",
    ]


def test_tools_described_in_the_system_prompt_are_said_so_and_probed(caplog):
    options = KeyLookupTaskConfig()  # tools_in_system_prompt=true, hermes
    _, lines = start(options, tokenizer_for("smollm2"), key_lookup(options)[0][0], caplog)
    assert "tool-call parser: hermes (configured)" in lines
    assert "chat template: the tools are described in the system prompt (none passed as tools=)" in lines
    assert "chat template: no tools offered" not in lines


def test_the_thinking_probe_runs_only_where_the_template_knows_think_blocks():
    assert applicable_probes(ChatRenderer(tokenizer_for("qwen3")), False) == ("a user reply after thinking",)
    assert applicable_probes(ChatRenderer(tokenizer_for("smollm2")), True) == ("a tool reply",)
    assert applicable_probes(ChatRenderer(build_char_tokenizer()), True) == ()
