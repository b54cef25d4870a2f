"""Llama 3.1 / 3.2 JSON calls: the turn is ``{"name": ..., "parameters": {...}}`` (optionally after
``<|python_tag|>``; several calls separated by ``;``). A turn that does not start with ``{`` is
a plain answer; one that does but is no valid call is a parse error."""

from __future__ import annotations

from grpo_lightning.environments.base import TOOL_PARSERS
from grpo_lightning.environments.parsers.common import Call, call_from_json, outside_strings

PYTHON_TAG = "<|python_tag|>"


@TOOL_PARSERS.register("llama3_json")
def parse_llama3_json(text: str) -> tuple[list[Call], list[str]]:
    body = text.strip()
    body = body[len(PYTHON_TAG) :].lstrip() if body.startswith(PYTHON_TAG) else body
    for end in ("<|eom_id|>", "<|eot_id|>"):
        body = body.removesuffix(end).rstrip()
    if not body.startswith("{"):
        return [], []
    calls, errors = [], []
    for part in _split_calls(body):
        call, error = call_from_json(part, arguments_key="parameters")
        calls += [call] if call else []
        errors += [error] if error else []
    return calls, errors


def _split_calls(body: str) -> list[str]:
    """``{...}; {...}`` split at top-level semicolons (outside strings and braces)."""
    parts, depth, start = [], 0, 0
    for i, char in outside_strings(body):
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == ";" and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return [part for part in parts if part.strip()]
