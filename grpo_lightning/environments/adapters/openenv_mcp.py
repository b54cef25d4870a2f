"""An OpenEnv MCP tool environment (``MCPEnvironment``, ``openenv`` 0.10) as an environment with its tools.

OpenEnv's own tool client plays an MCP environment as steps on the ``/ws`` session (the
``/mcp`` endpoint calls tools directly, with no reward and no episode): ``{"type": "list_tools"}``
returns the tools with their JSON input schemas, ``{"type": "call_tool", "tool_name", "arguments"}``
runs one and returns its result or a typed error, with the step's ``reward`` and ``done``. So after
``reset``, ``list_tools`` becomes our tool schemas; each parsed call of a turn is one ``call_tool``
step and one ``role: tool`` message; the server's errors (unknown tool, invalid arguments, the tool
raising, a timeout) are tool errors the model reads, counted by our kinds. A turn without a call
ends the episode (``stop_reason: answer``); a step the server marks ``done`` ends it too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from grpo_lightning.environments.adapters.openenv import OpenEnvSession, refusal
from grpo_lightning.environments.base import Message, Reset, Step, Turn
from grpo_lightning.environments.tools import ToolEnvironment

# OpenEnv's ToolErrorType -> our tool error kinds (docs/environments.md, "Tool errors are messages").
ERROR_KINDS = {
    "tool_not_found": "unknown_tool",
    "invalid_args": "bad_arguments",
    "execution_error": "exception",
    "timeout": "timeout",
    "transport_error": "exception",
}


def tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool (``name``, ``description``, ``input_schema``) as the chat template's function schema."""
    parameters = tool.get("input_schema") or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": tool.get("description", ""), "parameters": parameters},
    }


def result_text(result: Any) -> str:
    """What the model reads of a tool's result: FastMCP's ``data`` when it has one, else its text contents."""
    if isinstance(result, dict):
        if result.get("data") is not None:
            data = result["data"]
            return data if isinstance(data, str) else json.dumps(data)
        texts = [c.get("text", "") for c in result.get("content") or [] if c.get("type") == "text"]
        if texts:
            return "\n".join(texts)
    return result if isinstance(result, str) else json.dumps(result)


class OpenEnvMCPEnv(OpenEnvSession):
    """One episode on an OpenEnv MCP environment server at ``base_url``: its tools are ours.

    ``prompt(row, observation)`` gives the first messages (default: the row's prompt, then the reset
    observation as JSON). ``max_calls_per_turn`` refuses later calls with an error (None: no limit).
    Info carries ``tool_calls``, ``tool_error_kinds`` and ``episode_tool_totals`` like a ToolEnvironment's.
    """

    def __init__(
        self,
        base_url: str,
        prompt: Callable[[dict[str, Any], dict[str, Any]], list[Message]] | None = None,
        max_calls_per_turn: int | None = None,
    ):
        super().__init__(base_url)
        self.prompt, self.max_calls_per_turn = prompt, max_calls_per_turn
        self.tool_names: list[str] = []
        self.totals: Counter = Counter()

    async def reset(self, seed: int, row: dict[str, Any]) -> Reset:
        observation = await self.open(seed)
        listed = await self.send({"type": "step", "data": {"type": "list_tools"}})
        tools = [tool_schema(tool) for tool in listed["data"].get("observation", {}).get("tools", [])]
        if not tools:
            raise RuntimeError(f"the OpenEnv server at {self.base_url} lists no MCP tools: {listed['data']}")
        self.tool_names, self.totals = [t["function"]["name"] for t in tools], Counter()
        if self.prompt is not None:
            messages = self.prompt(row, observation)
        else:
            messages = [{"role": "user", "content": f"{row.get('prompt', '')}\n{json.dumps(observation)}".strip()}]
        return Reset(messages=messages, tools=tools, info={"observation": observation, "tools": self.tool_names})

    async def step(self, turn: Turn) -> Step:
        counts: Counter = Counter()
        messages: list[Message] = [self._error("parse", counts, None, error) for error in turn.parse_errors]
        if not turn.tool_calls and not turn.parse_errors:
            return self._finish(Step(done=True, info={"stop_reason": "answer"}), counts)
        limit = self.max_calls_per_turn
        run = turn.tool_calls if limit is None else turn.tool_calls[:limit]
        rewards, done = [], False
        for call in run:
            name = call.get("name")
            if done:  # the server ended the episode: later calls of the turn are not sent
                messages.append(self._error("episode_ended", counts, name, "not run: the episode has ended"))
                continue
            action = {"type": "call_tool", "tool_name": name, "arguments": call.get("arguments", {})}
            reply = await self.send({"type": "step", "data": action})
            if reply["type"] != "observation":  # the server could not read the action
                messages.append(self._error("bad_arguments", counts, name, refusal(reply["data"])))
                continue
            data = reply["data"]
            observation = data["observation"]
            if data.get("reward") is not None:
                rewards.append(float(data["reward"]))
            done = bool(data.get("done"))
            error = observation.get("error")
            if error:
                kind = ERROR_KINDS.get(error.get("error_type"), "exception")
                messages.append(self._error(kind, counts, name, error.get("message", "failed")))
            else:
                counts["calls"] += 1
                messages.append(self._message(name, result_text(observation.get("result"))))
        for call in turn.tool_calls[len(run) :]:
            messages.append(self._error("too_many_calls", counts, call.get("name"), f"not run: at most {limit} calls"))
        reward = sum(rewards) if rewards else None
        return self._finish(Step(messages=messages, reward=reward, done=done), counts)

    # The tool bookkeeping (messages, error counts, the step's info) is a ToolEnvironment's.
    _finish = ToolEnvironment._finish
    _error = ToolEnvironment._error
    _message = staticmethod(ToolEnvironment._message)
