"""What the tool-call parsers share: finding tagged blocks (a block cut by the length limit is an
error, not a silent miss) and turning a decoded JSON object into a call.

A parser never raises, whatever the model writes. JSON nested deeper than :data:`MAX_DEPTH` is a
parse error found by counting brackets, before ``json.loads``: nested a thousand levels it raised
``RecursionError``, and a call only just under Python's limit would raise it later, wherever the
arguments are walked (schema validation, the chat template, a log line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

Call = dict[str, Any]  # {"name": str, "arguments": dict}; "typed": False when values are strings to coerce
MAX_DEPTH = 64  # brackets nested in one call: far more than any tool's arguments need


def outside_strings(text: str) -> Iterator[tuple[int, str]]:
    """``(index, char)`` of every character of ``text`` outside JSON strings (the quotes included)."""
    in_string = escaped = False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        else:
            in_string = char == '"'
            yield i, char


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``{``/``[`` in ``text``, outside JSON strings (a scan, no recursion)."""
    depth = deepest = 0
    for _, char in outside_strings(text):
        if char in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "}]":
            depth = max(depth - 1, 0)
    return deepest


def bounded_loads(text: str) -> tuple[Any, str | None]:
    """``json.loads(text)``, or why not (never raises)."""
    if (depth := nesting_depth(text)) > MAX_DEPTH:
        return None, f"nested {depth} levels deep, more than {MAX_DEPTH}"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"{err.msg} at char {err.pos}"
    except (ValueError, RecursionError) as err:  # e.g. a number too long to convert
        return None, f"{type(err).__name__}: {str(err)[:80]}"


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
    obj, why = bounded_loads(body)
    if why is not None:
        return None, f"the tool call is not valid JSON ({why}): {snippet}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, f'the tool call must be a JSON object with a string "name": {snippet}'
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        arguments, why = bounded_loads(arguments)
        if why is not None:
            return None, f'the "{arguments_key}" of tool call {obj["name"]!r} are not valid JSON ({why})'
    if not isinstance(arguments, dict):
        return None, f'the "{arguments_key}" of tool call {obj["name"]!r} must be a JSON object, got {arguments!r:.80}'
    call: Call = {"name": obj["name"], "arguments": arguments}
    if isinstance(obj.get("id"), str):
        call["id"] = obj["id"]
    return call, None
