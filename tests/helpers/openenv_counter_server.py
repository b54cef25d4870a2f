"""A real OpenEnv 0.10 environment server on loopback, run with the openenv venv's Python:
``python openenv_counter_server.py PORT``. The game: reach the target by adding deltas; the
target comes from the reset seed. Used by the OpenEnv adapter's test (our venv does not import openenv)."""

from __future__ import annotations

import random
import sys

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class AddAction(Action):
    delta: int = Field(..., description="How much to add to the counter")


class CounterObservation(Observation):
    value: int = 0
    target: int = 0


class CounterEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.value, self.target = State(), 0, 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> CounterObservation:
        self.value, self.target = 0, random.Random(seed).randint(3, 9)
        self._state = State(episode_id=episode_id, step_count=0)
        return CounterObservation(value=0, target=self.target)

    def step(self, action: AddAction, timeout_s=None, **kwargs) -> CounterObservation:
        self.value += action.delta
        self._state.step_count += 1
        done = self.value == self.target
        return CounterObservation(value=self.value, target=self.target, done=done, reward=1.0 if done else 0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(CounterEnv, AddAction, CounterObservation, env_name="counter", max_concurrent_envs=16)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
