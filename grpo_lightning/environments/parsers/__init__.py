"""Tool-call parsers, one file per model family's format, registered in ``TOOL_PARSERS``.

The wrong parser makes calls silently never run, so :func:`choose_tool_parser` picks one from
what the chat template itself emits (its tool-call markup), then from the model's name, and says
why; the caller prints that line at start. A configured name always wins.
"""

from __future__ import annotations

from grpo_lightning.environments.base import TOOL_PARSERS
from grpo_lightning.environments.parsers import hermes, llama3_json, qwen3_coder  # noqa: F401  (register)

AUTO = "auto"
# (what to look for, where, the parser): the first match wins.
TEMPLATE_HINTS = (("<function=", "qwen3_coder"), ("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"))
NAME_HINTS = (("qwen3-coder", "qwen3_coder"), ("qwen", "hermes"), ("hermes", "hermes"), ("llama", "llama3_json"))
DEFAULT = "hermes"


def choose_tool_parser(
    configured: str = AUTO, model_name: str = "", chat_template: str | None = None
) -> tuple[str, str]:
    """(parser name, the reason, one line to print at start). Raises ConfigError for an unknown name."""
    if configured != AUTO:
        TOOL_PARSERS[configured]  # noqa: B018  (raises naming the closest registered parser)
        return configured, f"tool-call parser: {configured} (configured)"
    for marker, name in TEMPLATE_HINTS:
        if chat_template and marker in chat_template:
            return name, f"tool-call parser: {name} (the chat template emits {marker})"
    lowered = model_name.lower()
    for marker, name in NAME_HINTS:
        if marker in lowered:
            return name, f"tool-call parser: {name} (the model name contains {marker!r})"
    return DEFAULT, (
        f"tool-call parser: {DEFAULT} (neither the chat template nor the model name says which; "
        "set task.tool_parser if the model writes calls another way)"
    )
