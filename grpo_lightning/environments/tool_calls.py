"""Running one tool call under a time limit that really stops it, or says plainly that it cannot.

Three ways, chosen per tool (:class:`~grpo_lightning.environments.tools.Tool.isolation`):

- ``"thread"`` (the default for a plain function): the call runs in its own daemon thread. Python
  cannot stop a thread, so a call past its limit is *abandoned*: the model gets a timeout message
  at once, but the thread keeps running (and keeps its share of the CPU) until the function
  returns by itself. Each abandoned thread is counted, so a run that leaks them shows it.
- ``"process"``: the call runs in a ``spawn``-ed worker process that is killed at the limit (a
  fresh worker serves the next call). For untrusted, CPU-bound or possibly hanging code. The
  function must be importable by module and name (not a lambda or a closure), as for rewards
  under ``task.reward_timeout_s``; importing its module is not counted against the limit.
- an ``async def`` tool is awaited with :func:`asyncio.wait_for`: it is cancelled at its next
  ``await``, which only stops code that does await.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from dataclasses import dataclass
from typing import Any

from grpo_lightning.environments.daemon import awaited_in_daemon_thread
from grpo_lightning.errors import StoppedAtOnce
from grpo_lightning.rewards.isolation import IsolatedReward, RewardCallFailed, RewardWorkerError

ISOLATIONS = ("thread", "process")


@dataclass
class CallResult:
    """One call's outcome: the output text, or the error kind and message the model will read."""

    output: str | None = None
    error_kind: str | None = None  # "exception", "timeout", "worker"
    error: str | None = None
    abandoned: bool = False  # a thread still running past its limit


def as_text(value: Any) -> str:
    """A tool's return value as the text of a tool message (JSON for structured values)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _raised(err: BaseException) -> CallResult:
    return CallResult(error_kind="exception", error=f"{type(err).__name__}: {err}")


def _timed_out(name: str, timeout_s: float, how: str, abandoned: bool = False) -> CallResult:
    return CallResult(
        error_kind="timeout", error=f"tool {name!r} did not finish within {timeout_s:g} s; {how}", abandoned=abandoned
    )


async def _in_thread(name: str, fn, arguments: dict, timeout_s: float | None) -> CallResult:
    try:
        value = await asyncio.wait_for(
            awaited_in_daemon_thread(lambda: fn(**arguments), name=f"tool-{name}"), timeout_s
        )
    except TimeoutError:
        return _timed_out(name, timeout_s, "it was abandoned (a thread cannot be stopped)", abandoned=True)
    except StoppedAtOnce:  # the run's own second-signal stop, raised on this thread
        raise
    except (Exception, SystemExit) as err:  # noqa: BLE001  (sys.exit() in a tool is the tool's failure)
        return _raised(err)
    return CallResult(output=as_text(value))


async def _awaited(name: str, fn, arguments: dict, timeout_s: float | None) -> CallResult:
    try:
        value = await asyncio.wait_for(fn(**arguments), timeout_s)
    except TimeoutError:
        return _timed_out(name, timeout_s, "it was cancelled")
    except Exception as err:  # noqa: BLE001
        return _raised(err)
    return CallResult(output=as_text(value))


class ProcessTool:
    """A tool function served by a killable worker process (see the module docstring)."""

    def __init__(self, name: str, fn, timeout_s: float):
        self.name, self.timeout_s = name, timeout_s
        self._worker = IsolatedReward(name, fn, timeout_s)  # raises for a function a worker cannot import
        self._lock = threading.Lock()  # one call at a time per worker

    def _call(self, arguments: dict) -> CallResult:
        with self._lock:
            try:
                return CallResult(output=as_text(self._worker(**arguments)))
            except RewardCallFailed as err:
                return CallResult(error_kind="exception", error=f"{err.kind}: {err}")
            except RewardWorkerError as err:
                if "ran past" in str(err):
                    return _timed_out(self.name, self.timeout_s, "its worker process was killed")
                return CallResult(error_kind="worker", error=f"tool {self.name!r} could not run: {err}")

    async def __call__(self, arguments: dict) -> CallResult:
        return await asyncio.to_thread(self._call, arguments)

    def close(self) -> None:
        self._worker.close()


async def run_call(name: str, fn, arguments: dict, timeout_s: float | None, worker: ProcessTool | None) -> CallResult:
    """Call ``fn(**arguments)`` in the tool's way; never raises for anything the tool does."""
    if worker is not None:
        return await worker(arguments)
    if inspect.iscoroutinefunction(fn):
        return await _awaited(name, fn, arguments, timeout_s)
    return await _in_thread(name, fn, arguments, timeout_s)
