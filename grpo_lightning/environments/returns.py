"""What an environment's ``reset`` and ``step`` may return, checked as a reward function's values are.

A wrong return ran before: a message with role ``"bogus"`` or integer content reached the chat
template, ``messages="not a list"`` was iterated character by character, and a reward ``"1.0"``
was coerced by ``float()`` where a reward function returning the string is refused. Each is the
environment's bug, the same in every episode: :class:`EnvironmentReturnError` ends the run in
one line naming the environment, the method, the field and the value (exit 2).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from grpo_lightning.environments.base import Reset, Step
from grpo_lightning.errors import UserError
from grpo_lightning.rewards.values import as_reward

ROLES = ("system", "user", "assistant", "tool")


class EnvironmentReturnError(UserError, TypeError):
    """An environment returned something the runner cannot use; the message names the environment."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _messages(where: str, messages: Any) -> list[str]:
    if not isinstance(messages, list):
        return [
            f"{where}.messages must be a list of chat messages, got a {type(messages).__name__}: {_short(messages)}"
        ]
    problems = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            problems.append(f"{where}.messages[{i}] must be a dict, got a {type(message).__name__}: {_short(message)}")
        elif message.get("role") not in ROLES:
            problems.append(f"{where}.messages[{i}] has role {message.get('role')!r}; a role is one of {list(ROLES)}")
        elif not isinstance(message.get("content"), str) and not _parts(message.get("content")):
            content = message.get("content")
            problems.append(
                f"{where}.messages[{i}] content must be a string, got a {type(content).__name__}: {_short(content)} "
                "(or a list of parts: {'type': 'text', 'text': str}, {'type': 'image', 'image': a picture})"
            )
    return problems


def _parts(content: Any) -> bool:
    """A structured content: text parts with string text and image parts carrying their picture."""
    return isinstance(content, list) and all(
        isinstance(p, dict)
        and (
            (p.get("type") == "text" and isinstance(p.get("text"), str))
            or (p.get("type") == "image" and p.get("image") is not None)
        )
        for p in content
    )


def _info(where: str, info: Any) -> list[str]:
    return [] if isinstance(info, dict) else [f"{where}.info must be a dict, got a {type(info).__name__}"]


def reset_problems(where: str, value: Any) -> list[str]:
    if not isinstance(value, Reset):
        return [
            f"{where} must return a grpo_lightning.environments.Reset, got a {type(value).__name__}: {_short(value)}"
        ]
    problems = _messages(where, value.messages) + _info(where, value.info)
    if not problems and not value.messages:
        problems.append(f"{where}.messages is empty: the episode needs a first observation")
    tools = value.tools
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        problems.append(f"{where}.tools must be a list of JSON schemas (dicts), got {_short(tools)}")
    return problems


def step_problems(where: str, value: Any) -> list[str]:
    if not isinstance(value, Step):
        return [
            f"{where} must return a grpo_lightning.environments.Step, got a {type(value).__name__}: {_short(value)}"
        ]
    problems = _messages(where, value.messages) + _info(where, value.info)
    try:
        reward = as_reward(value.reward)
    except TypeError:
        problems.append(
            f"{where}.reward must be a number or None (as a reward function's values), got a "
            f"{type(value.reward).__name__}: {_short(value.reward)}"
        )
    else:
        if reward is not None and not math.isfinite(reward):
            problems.append(f"{where}.reward is {reward}: a non-finite reward would poison its group's advantages")
    if not isinstance(value.done, (bool, np.bool_)):
        problems.append(f"{where}.done must be True or False, got a {type(value.done).__name__}: {_short(value.done)}")
    return problems


def checked(environment: str, method: str, value: Any) -> Any:
    """``value`` when it is what ``method`` (reset or step) may return, else :class:`EnvironmentReturnError`."""
    where = f"{method}()"
    problems = (reset_problems if method == "reset" else step_problems)(where, value)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise EnvironmentReturnError(
            f"environment {environment!r}: {problems[0]}{more}; fix what its {method}() returns"
        )
    return value
