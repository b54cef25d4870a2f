"""A tool environment built from plain Python callables.

Each tool is a function with type hints and a Google-style docstring; its JSON schema (what the
chat template shows the model) comes from ``transformers.utils.get_json_schema``, and every call's
arguments are validated against that schema (``jsonschema``) before the function runs. Nothing a
tool call does is raised: an unparsable call, an unknown tool, arguments of the wrong type, an
exception inside the tool, a timeout or too long an output each become a ``role: tool`` message
the model reads on its next turn, and each is counted in the step's ``info`` by kind
(``tool_error_kinds``; ``tool_outcomes`` names each call's outcome, ``ok`` or its kind).

The episode ends on a turn without any tool call (the final answer), scored by ``reward``.
Limits (:class:`ToolLimits`): calls per turn, output tokens per call (truncate, drop or end the
episode), and each call's time limit (see :mod:`.tool_calls` for what a limit can stop).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from transformers.utils import get_json_schema

from grpo_lightning.environments import parsers  # noqa: F401  (registers the parsers)
from grpo_lightning.environments.base import TOOL_PARSERS, Message, Reset, Step, Turn
from grpo_lightning.environments.parsers.common import bounded_loads
from grpo_lightning.environments.tool_calls import ISOLATIONS, ProcessTool, run_call
from grpo_lightning.errors import PluginError

OVERFLOWS = ("truncate", "drop", "end")


@dataclass
class ToolLimits:
    """What one turn's tool calls may do. ``None`` means no limit."""

    max_calls_per_turn: int | None = 4  # calls beyond it are answered with an error, not run
    max_output_tokens: int | None = 256  # per call; counted with the tokenizer (characters without one)
    output_overflow: str = "truncate"  # "truncate" | "drop" | "end" (end the episode)
    timeout_s: float | None = 10.0  # per call; a tool's own timeout_s wins

    def __post_init__(self):
        if self.output_overflow not in OVERFLOWS:
            raise PluginError(f"ToolLimits.output_overflow={self.output_overflow!r}; choose one of {OVERFLOWS}")


@dataclass
class Tool:
    """A callable offered to the model, with its schema and how it runs."""

    fn: Callable[..., Any]
    isolation: str = "thread"  # "thread" (abandoned at its limit) or "process" (killed at its limit)
    timeout_s: float | None = None  # None: ToolLimits.timeout_s
    schema: dict[str, Any] = field(default_factory=dict)  # filled from the function when empty

    def __post_init__(self):
        if self.isolation not in ISOLATIONS:
            raise PluginError(f"tool {self.fn!r}: isolation={self.isolation!r}; choose one of {ISOLATIONS}")
        if not self.schema:
            self.schema = tool_schema(self.fn)

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema chat templates take, from ``fn``'s type hints and docstring."""
    try:
        schema = get_json_schema(fn)
    except Exception as err:  # noqa: BLE001  (transformers' own exception types vary by version)
        name = getattr(fn, "__name__", repr(fn))
        raise PluginError(
            f"tool {name!r}: no JSON schema can be built ({err}); give every argument a type hint and the "
            "function a Google-style docstring with an Args: section"
        ) from err
    schema["function"].pop("return", None)  # not part of what the model is shown
    return schema


def as_tool(entry: Callable[..., Any] | Tool) -> Tool:
    return entry if isinstance(entry, Tool) else Tool(entry)


def _strict(parameters: dict[str, Any]) -> dict[str, Any]:
    """The parameters' schema refusing unknown argument names (the model gets told, not a TypeError)."""
    return {"additionalProperties": False, **parameters}


def coerce(arguments: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """String values turned into their declared JSON type, for parsers whose format has only strings."""
    out = {}
    for key, value in arguments.items():
        kind = parameters.get("properties", {}).get(key, {}).get("type")
        if isinstance(value, str) and kind not in (None, "string"):
            decoded, why = bounded_loads(value)
            value = value if why is not None else decoded  # left as a string: validation names the wrong type
        out[key] = value
    return out


def _kind(counts: Counter) -> str:
    """A call's outcome: its error kind (``exception``, ``output_too_long``, ...) or ``ok``."""
    return next((kind[6:] for kind in counts if kind.startswith("error/")), "ok")


def _outcome(call: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"name": call.get("name"), "arguments": call.get("arguments"), "outcome": kind}


class ToolEnvironment:
    """An :class:`~grpo_lightning.environments.base.Environment` whose actions are tool calls.

    ``prompt(row)`` gives the first messages (default: ``row["messages"]``, or ``row["prompt"]`` as
    one user message); ``reward(text, row)`` scores the final answer. ``parser`` (a name in
    ``TOOL_PARSERS``) makes the environment parse each turn's text itself; without it, the runner's
    parsed ``Turn.tool_calls`` are used. ``tokenizer`` counts tool output tokens.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool],
        *,
        prompt: Callable[[dict[str, Any]], list[Message]] | None = None,
        reward: Callable[[str, dict[str, Any]], float | None] | None = None,
        limits: ToolLimits | None = None,
        parser: str | None = None,
        tokenizer: Any = None,
    ):
        self.tools = {tool.name: tool for tool in map(as_tool, tools)}
        self.prompt, self.reward = prompt, reward
        self.limits = limits or ToolLimits()
        self.parse = TOOL_PARSERS[parser] if parser else None
        self.tokenizer = tokenizer
        self.row: dict[str, Any] = {}
        self.totals: Counter = Counter()  # over the episode: calls, errors by kind, abandoned threads
        self._workers = {
            name: ProcessTool(name, tool.fn, self._timeout(tool) or self.limits.timeout_s or 60.0)
            for name, tool in self.tools.items()
            if tool.isolation == "process"
        }

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    def _timeout(self, tool: Tool) -> float | None:
        return tool.timeout_s if tool.timeout_s is not None else self.limits.timeout_s

    def reset(self, seed: int, row: dict[str, Any]) -> Reset:
        self.row, self.totals = row, Counter()
        if self.prompt is not None:
            messages = self.prompt(row)
        elif "messages" in row:
            messages = list(row["messages"])
        else:
            messages = [{"role": "user", "content": row["prompt"]}]
        return Reset(messages=messages, tools=self.schemas, info={"tools": list(self.tools)})

    async def step(self, turn: Turn) -> Step:
        calls, parse_errors = self.parse(turn.text) if self.parse else (turn.tool_calls, turn.parse_errors)
        counts: Counter = Counter()
        messages: list[Message] = [self._error("parse", counts, None, error) for error in parse_errors]
        if not calls and not parse_errors:
            reward = self.reward(turn.text, self.row) if self.reward is not None else None
            return self._finish(Step(reward=reward, done=True, info={"stop_reason": "answer"}), counts)
        limit = self.limits.max_calls_per_turn
        run, refused = (calls, []) if limit is None else (calls[:limit], calls[limit:])
        each = [Counter() for _ in run]  # one call's counts: its outcome for the transcript
        results = await asyncio.gather(*(self._call(call, c) for call, c in zip(run, each, strict=True)))
        for c in each:
            counts.update(c)
        ended = any(end for _, end in results)
        messages += [message for message, _ in results]
        for call in refused:
            why = f"not run: at most {limit} tool calls per turn"
            messages.append(self._error("too_many_calls", counts, call.get("name"), why))
        outcomes = [{"name": None, "outcome": "parse"} for _ in parse_errors]
        outcomes += [_outcome(call, _kind(c)) for call, c in zip(run, each, strict=True)]
        outcomes += [_outcome(call, "too_many_calls") for call in refused]
        info = {"stop_reason": "tool_output_too_long"} if ended else {}
        info["tool_outcomes"] = outcomes  # one per call, in the order of the turn's calls
        return self._finish(Step(messages=messages, done=ended, info=info), counts)

    def _finish(self, step: Step, counts: Counter) -> Step:
        self.totals.update(counts)
        step.info.update(
            tool_calls=counts["calls"],
            tool_errors=sum(n for kind, n in counts.items() if kind.startswith("error/")),
            tool_error_kinds={kind[6:]: n for kind, n in counts.items() if kind.startswith("error/")},
            parse_errors=counts["error/parse"],
            abandoned_threads=counts["abandoned_threads"],
            episode_tool_totals=dict(self.totals),  # survives the runner merging each step's info
        )
        return step

    def _error(self, kind: str, counts: Counter, name: str | None, error: str) -> Message:
        counts[f"error/{kind}"] += 1
        return self._message(name, f"Error: {error}")

    @staticmethod
    def _message(name: str | None, content: str, call_id: str | None = None) -> Message:
        message: Message = {"role": "tool", "content": content}
        if name:
            message["name"] = name
        if call_id:
            message["tool_call_id"] = call_id
        return message

    async def _call(self, call: dict[str, Any], counts: Counter) -> tuple[Message, bool]:
        name, arguments = call.get("name"), call.get("arguments", {})
        tool = self.tools.get(name)
        if tool is None:
            return self._error(
                "unknown_tool", counts, name, f"unknown tool {name!r}; tools: {sorted(self.tools)}"
            ), False
        parameters = tool.schema["function"].get("parameters", {"type": "object", "properties": {}})
        if not call.get("typed", True) and isinstance(arguments, dict):
            arguments = coerce(arguments, parameters)
        try:
            jsonschema.validate(arguments, _strict(parameters))
        except jsonschema.ValidationError as err:
            where = "/".join(map(str, err.absolute_path)) or "arguments"
            return self._error(
                "bad_arguments", counts, name, f"invalid arguments for {name!r}: {where}: {err.message}"
            ), False
        counts["calls"] += 1
        result = await run_call(name, tool.fn, arguments, self._timeout(tool), self._workers.get(name))
        counts["abandoned_threads"] += int(result.abandoned)
        if result.error is not None:
            return self._error(result.error_kind, counts, name, result.error), False
        content, ended = self._bounded(result.output, counts)
        return self._message(name, content, call.get("id")), ended

    def _bounded(self, text: str, counts: Counter) -> tuple[str, bool]:
        """``text`` within ``max_output_tokens``: (content, whether the episode ends)."""
        limit = self.limits.max_output_tokens
        ids = self.tokenizer.encode(text, add_special_tokens=False) if self.tokenizer is not None else text
        if limit is None or len(ids) <= limit:
            return text, False
        counts["error/output_too_long"] += 1
        unit = "tokens" if self.tokenizer is not None else "characters"
        if self.limits.output_overflow == "truncate":
            kept = self.tokenizer.decode(ids[:limit]) if self.tokenizer is not None else text[:limit]
            return f"{kept}\n[output truncated: {limit} of {len(ids)} {unit} shown]", False
        note = f"[output dropped: {len(ids)} {unit}, more than the limit of {limit}]"
        return note, self.limits.output_overflow == "end"

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
