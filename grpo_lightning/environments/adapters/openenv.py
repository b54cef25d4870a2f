"""An OpenEnv action environment (a server, ``openenv`` 0.10) as an environment with one tool.

OpenEnv environments run as servers; one episode is one WebSocket session on ``/ws`` (its plain
HTTP ``/reset`` and ``/step`` make a fresh environment per request, so they cannot play an
episode). The server's action schema (``GET /schema``) becomes the one tool's parameters, so the
model acts by calling it; each call is one ``step`` and its observation comes back as the tool
message. A turn without a call ends the episode. An action the server refuses (its pydantic
validation) is a tool error the model reads, counted like every other tool error.

This client speaks the wire protocol with ``httpx`` and ``websockets`` and does not import
``openenv``, whose pins clash with ours: run the server from its own environment (the test runs
a real openenv 0.10 server from its own venv). MCP tool environments: ``openenv_mcp.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from grpo_lightning.environments.base import Message, Reset, Step, Turn

_SCHEMAS: dict[str, dict[str, Any]] = {}  # base URL -> the server's action schema, read once


def action_tool(schema: dict[str, Any], name: str, description: str) -> dict[str, Any]:
    """The action's JSON schema as a tool (its ``metadata`` field is the protocol's, not the model's)."""
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    parameters = {"type": "object", "properties": properties, "required": schema.get("required", [])}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def refusal(data: dict[str, Any]) -> str:
    """Why the server refused a step (its pydantic validation errors), in one line."""
    detail = "; ".join(f"{'/'.join(map(str, e.get('loc', [])))}: {e.get('msg')}" for e in data.get("errors", []))
    return f"{data.get('message', 'refused')}: {detail}".rstrip(": ")


class OpenEnvSession:
    """One WebSocket session (``/ws``) on an OpenEnv server: ``open`` resets, ``send`` speaks, ``close`` ends."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self.ws: ClientConnection | None = None

    async def send(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(json.dumps(message))
        return json.loads(await self.ws.recv())

    async def open(self, seed: int) -> dict[str, Any]:
        """Connect and reset with ``seed``: the first observation."""
        self.ws = await connect(self.base_url.replace("http", "ws", 1) + "/ws", max_size=None)
        reply = await self.send({"type": "reset", "data": {"seed": seed}})
        if reply["type"] != "observation":
            raise RuntimeError(f"the OpenEnv server refused reset: {reply['data']}")
        return reply["data"]["observation"]

    async def close(self) -> None:
        if self.ws is not None:
            try:
                await self.ws.send(json.dumps({"type": "close"}))
            finally:
                await self.ws.close()
                self.ws = None


class OpenEnvActionEnv(OpenEnvSession):
    """One episode on an OpenEnv server at ``base_url`` (``http://127.0.0.1:8000``).

    ``prompt(row, observation)`` gives the first messages (default: the row's prompt, then the first
    observation as JSON). Info carries ``tool_calls`` and ``tool_error_kinds`` like a ToolEnvironment's.
    """

    def __init__(
        self,
        base_url: str,
        tool_name: str = "act",
        description: str = "Take one action in the environment.",
        prompt: Callable[[dict[str, Any], dict[str, Any]], list[Message]] | None = None,
    ):
        super().__init__(base_url)
        self.tool_name, self.description, self.prompt = tool_name, description, prompt

    async def _schema(self) -> dict[str, Any]:
        if self.base_url not in _SCHEMAS:
            async with httpx.AsyncClient(timeout=30) as client:
                response = await client.get(f"{self.base_url}/schema")
                response.raise_for_status()
                _SCHEMAS[self.base_url] = response.json()["action"]
        return _SCHEMAS[self.base_url]

    async def reset(self, seed: int, row: dict[str, Any]) -> Reset:
        tool = action_tool(await self._schema(), self.tool_name, self.description)
        observation = await self.open(seed)
        if self.prompt is not None:
            messages = self.prompt(row, observation)
        else:
            first = row.get("prompt", "")
            messages = [{"role": "user", "content": f"{first}\n{json.dumps(observation)}".strip()}]
        return Reset(messages=messages, tools=[tool], info={"observation": observation})

    async def step(self, turn: Turn) -> Step:
        calls, kinds = turn.tool_calls, {}
        messages: list[Message] = []
        for error in turn.parse_errors:
            kinds["parse"] = kinds.get("parse", 0) + 1
            messages.append({"role": "tool", "content": f"Error: {error}"})
        if not calls:
            info = {"stop_reason": "answer", "tool_calls": 0, "tool_error_kinds": kinds}
            return Step(messages=messages, done=not messages, info=info)
        call, *extra = calls
        for other in extra:
            kinds["too_many_calls"] = kinds.get("too_many_calls", 0) + 1
            messages.append({"role": "tool", "name": other.get("name"), "content": "Error: one action per turn"})
        if call.get("name") != self.tool_name:
            kinds["unknown_tool"] = kinds.get("unknown_tool", 0) + 1
            text = f"Error: unknown tool {call.get('name')!r}; the one tool is {self.tool_name!r}"
            return Step(messages=[{"role": "tool", "content": text}, *messages], info={"tool_error_kinds": kinds})
        reply = await self.send({"type": "step", "data": call.get("arguments", {})})
        if reply["type"] != "observation":  # the server refused the action: the model is told why
            kinds["bad_arguments"] = kinds.get("bad_arguments", 0) + 1
            text = f"Error: {refusal(reply['data'])}"
            return Step(
                messages=[{"role": "tool", "name": self.tool_name, "content": text}, *messages],
                info={"tool_calls": 0, "tool_error_kinds": kinds},
            )
        data = reply["data"]
        result: Message = {"role": "tool", "name": self.tool_name, "content": json.dumps(data["observation"])}
        info = {"tool_calls": 1, "tool_error_kinds": kinds, "observation": data["observation"]}
        return Step(messages=[result, *messages], reward=data.get("reward"), done=bool(data.get("done")), info=info)
