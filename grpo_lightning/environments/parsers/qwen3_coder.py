"""Qwen3-Coder's XML calls::

    <tool_call>
    <function=lookup>
    <parameter=key>
    alpha
    </parameter>
    </function>
    </tool_call>

Every value is text; the call is marked ``typed: False`` so the tool environment converts each
value to the type its schema declares before validating it.
"""

from __future__ import annotations

import re

from grpo_lightning.environments.base import TOOL_PARSERS
from grpo_lightning.environments.parsers.common import Call, blocks

FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


def _strip_newlines(value: str) -> str:
    """The value without the one newline the format puts after the opening and before the closing tag."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


@TOOL_PARSERS.register("qwen3_coder")
def parse_qwen3_coder(text: str) -> tuple[list[Call], list[str]]:
    bodies, errors = blocks(text, "<tool_call>", "</tool_call>")
    calls = []
    for body in bodies:
        functions = FUNCTION.findall(body)
        if len(functions) != 1:
            errors.append(f"a tool call must hold exactly one <function=NAME>...</function>: {body.strip()[:200]}")
            continue
        name, inner = functions[0]
        arguments = {key: _strip_newlines(value) for key, value in PARAMETER.findall(inner)}
        leftover = PARAMETER.sub("", inner).strip()
        if leftover:
            errors.append(f"tool call {name!r} has text outside <parameter=...> tags: {leftover[:120]}")
            continue
        calls.append({"name": name, "arguments": arguments, "typed": False})
    return calls, errors
