"""Text of TRL's two completion formats: a string, or ``[{"role": "assistant", "content": ...}]``."""

from __future__ import annotations

from typing import Any


def message_text(value: Any) -> str:
    """A string as it is; a list of chat messages as the content of its last message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return "" if value is None else str(value)
