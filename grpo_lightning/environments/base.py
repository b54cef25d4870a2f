"""The seam of multi-turn training: what an environment is, what one turn returns, and the registries.

An episode is token-in/token-out: the runner (``environments/episode.py``) renders the prompt
once, appends every sampled id unchanged with loss mask 1, and appends the environment's
messages as template ids with loss mask 0. An environment never sees or returns token ids:
it speaks in chat messages; the runner owns the tokens.

Environments, tool-call parsers and reward aggregators are registered plug-ins, like every
other extension (``plugins=[my_env.py]`` adds one without editing the package). Async-first:
:func:`call_maybe_async` lets a synchronous environment implement the same protocol.

This module imports only the stdlib and the package's lowest layers.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from grpo_lightning.registry import Registry

Message = dict[str, Any]  # a chat message: {"role": ..., "content": ..., optional "tool_calls"/"name"}
T = TypeVar("T")


@dataclass
class Reset:
    """What :meth:`Environment.reset` returns: the episode's first messages and the tools on offer."""

    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)  # JSON schemas, as chat templates take them
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """What :meth:`Environment.step` returns after one model turn."""

    messages: list[Message] = field(default_factory=list)  # the environment's reply (tool results, user turns)
    reward: float | None = None  # a per-step reward, combined over the episode by the aggregator
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """The model's turn as the environment receives it: the decoded text (for reading only, never
    re-encoded for training), the sampled ids, and the tool calls the parser found in it."""

    text: str
    token_ids: list[int]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name": str, "arguments": dict}
    parse_errors: list[str] = field(default_factory=list)  # tool calls that could not be parsed, why
    finished: bool = True  # ended with EOS (False: cut by a limit)


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment. Methods may be ``async def`` or plain ``def``."""

    def reset(self, seed: int, row: dict[str, Any]) -> Reset | Awaitable[Reset]: ...

    def step(self, turn: Turn) -> Step | Awaitable[Step]: ...

    def close(self) -> None | Awaitable[None]: ...


async def call_maybe_async(fn: Callable[..., T | Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` and await its result when it is awaitable, so sync and async environments share one path."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result  # type: ignore[return-value]


# name -> a factory ``(options, row) -> Environment`` (one environment per episode).
ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment", "task.environment")
# name -> a parser ``(text) -> (tool_calls, parse_errors)``, one per model family's tool-call format.
TOOL_PARSERS: Registry[Callable[[str], tuple[list[dict[str, Any]], list[str]]]] = Registry(
    "tool-call parser", "task.tool_parser"
)
# name -> ``(step_rewards, final_reward) -> float``: how per-step environment rewards become one reward.
REWARD_AGGREGATORS: Registry[Callable[[list[float], float | None], float]] = Registry(
    "reward aggregator", "task.reward_aggregator"
)
