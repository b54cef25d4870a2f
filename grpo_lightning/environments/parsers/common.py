"""What the tool-call parsers share: finding tagged blocks (a block cut by the length limit is an
error, not a silent miss) and turning a decoded JSON object into a call."""

from __future__ import annotations

import json
from typing import Any

Call = dict[str, Any]  # {"name": str, "arguments": dict}; "typed": False when values are strings to coerce


def blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], list[str]]:
    """The bodies between ``open_tag`` and ``close_tag``, and an error for a block never closed."""
    bodies, errors, start = [], [], 0
    while (begin := text.find(open_tag, start)) >= 0:
        end = text.find(close_tag, begin + len(open_tag))
        if end < 0:
            errors.append(f"a tool call was cut off: {open_tag} without {close_tag} (the turn ended first)")
            break
        bodies.append(text[begin + len(open_tag) : end])
        start = end + len(close_tag)
    return bodies, errors


def call_from_json(body: str, arguments_key: str = "arguments") -> tuple[Call | None, str | None]:
    """``{"name": ..., "<arguments_key>": {...}}`` as a call, or why it is not one."""
    snippet = body.strip()[:200]
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return None, f"the tool call is not valid JSON ({err.msg} at char {err.pos}): {snippet}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, f'the tool call must be a JSON object with a string "name": {snippet}'
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return None, f'the "{arguments_key}" of tool call {obj["name"]!r} are not valid JSON ({err.msg})'
    if not isinstance(arguments, dict):
        return None, f'the "{arguments_key}" of tool call {obj["name"]!r} must be a JSON object, got {arguments!r:.80}'
    call: Call = {"name": obj["name"], "arguments": arguments}
    if isinstance(obj.get("id"), str):
        call["id"] = obj["id"]
    return call, None
