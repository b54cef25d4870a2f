"""A real OpenEnv 0.10 MCP tool environment (``MCPEnvironment`` + FastMCP) on loopback, run with the
openenv venv's Python: ``python openenv_mcp_server.py PORT``. Two tools: ``lookup(key)`` returns the
value hidden under the key (drawn from the reset seed; an unknown key raises inside the tool) and
``submit(answer)`` ends the episode, reward 1 when the answer is the value. Used by the OpenEnv MCP
adapter's test (our venv does not import openenv)."""

from __future__ import annotations

import random
import sys

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State


class LookupMCPEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("lookup")
        self.key, self.value, self.answer = "", "", None

        @mcp.tool()
        def lookup(key: str) -> str:
            """The value stored under a key."""
            if key != self.key:
                raise ValueError(f"no value under {key!r}")
            return self.value

        @mcp.tool()
        def submit(answer: str) -> str:
            """Give the final answer; ends the episode."""
            self.answer = answer
            return "submitted"

        super().__init__(mcp)
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:
        rng = random.Random(seed)
        self.key, self.value, self.answer = f"k{rng.randint(10, 99)}", str(rng.randint(1000, 9999)), None
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"key": self.key})

    async def step_async(self, action, timeout_s=None, **kwargs) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(observation, CallToolObservation) and self.answer is not None:
            observation.done, observation.reward = True, float(self.answer == self.value)
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation(metadata={"error": "only MCP actions"})

    @property
    def state(self) -> State:
        return self._state


app = create_app(LookupMCPEnv, CallToolAction, CallToolObservation, env_name="lookup", max_concurrent_envs=16)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
