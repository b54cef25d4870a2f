"""Hermes-style calls: a JSON object per ``<tool_call>...</tool_call>`` block (Qwen2.5, Qwen3,
Hermes, SmolLM3 and most templates that render ``tools=``)."""

from __future__ import annotations

from grpo_lightning.environments.base import TOOL_PARSERS
from grpo_lightning.environments.parsers.common import Call, blocks, call_from_json


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> tuple[list[Call], list[str]]:
    bodies, errors = blocks(text, "<tool_call>", "</tool_call>")
    calls = []
    for body in bodies:
        call, error = call_from_json(body)
        calls += [call] if call else []
        errors += [error] if error else []
    return calls, errors
