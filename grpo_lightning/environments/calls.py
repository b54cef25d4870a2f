"""Calling an environment's ``reset``/``step``/``close``: under the step time limit, in a daemon
thread for a plain function, every failure one :class:`EnvironmentCallFailed` naming the
environment, the call and, for an exception, its type, message and where it was raised.

The episode runner turns such a failure into a failed episode; the start-up check
(:func:`first_reset`, before any step) into a one-line :class:`EnvironmentStartError`: an
environment whose first reset fails, hangs or returns something wrong is broken for every episode.
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from collections.abc import Callable
from typing import Any

from grpo_lightning.environments import returns
from grpo_lightning.environments.base import Reset, call_maybe_async
from grpo_lightning.environments.daemon import awaited_in_daemon_thread, in_daemon_thread
from grpo_lightning.environments.limits import ENV_ERROR, STEP_TIMEOUT
from grpo_lightning.errors import StoppedAtOnce, UserError


class EnvironmentCallFailed(Exception):
    """A call raised (``kind`` env_error) or ran past the step limit (step_timeout); the message says which."""

    def __init__(self, message: str, kind: str, error_type: str = ""):
        super().__init__(message)
        self.kind, self.error_type = kind, error_type


class EnvironmentStartError(UserError, RuntimeError):
    """The environment could not be made or reset before the first step; the message names it."""


def label(name: str, env: Any = None) -> str:
    """``environment '<name>'``, as errors name it: its registered name, else its class."""
    return f"environment {name or (type(env).__name__ if env is not None else '?')!r}"


def raised(err: BaseException) -> str:
    """``Type: message (file:line in function)``: the exception and the innermost frame that raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    message = str(err).strip().splitlines()
    return f"{type(err).__name__}: {message[0] if message else ''}{where}"


def made(make_env: Callable[[dict], Any], row: dict, name: str) -> Any:
    """``make_env(row)``; a UserError (a tool without a schema) is the user's configuration and passes."""
    try:
        return make_env(row)
    except UserError:
        raise
    except Exception as err:
        message = f"{label(name)}: could not be made: {raised(err)}"
        raise EnvironmentCallFailed(message, ENV_ERROR, type(err).__name__) from err


async def call_environment(env: Any, fn: Callable[..., Any], *args: Any, timeout_s: float | None, name: str) -> Any:
    """``fn(*args)``: a coroutine on the loop, a plain function in a daemon thread of its own (abandoned,
    not stopped, when ``timeout_s`` passes, and never waited for at exit)."""
    call = f"{getattr(fn, '__name__', 'call')}()"
    try:
        if inspect.iscoroutinefunction(fn):
            return await asyncio.wait_for(call_maybe_async(fn, *args), timeout_s)
        result = await asyncio.wait_for(awaited_in_daemon_thread(fn, *args, name=f"env-{call[:-2]}"), timeout_s)
        if inspect.isawaitable(result):  # a plain function that hands back a coroutine
            result = await asyncio.wait_for(result, timeout_s)
        return result
    except TimeoutError as err:
        message = f"{label(name, env)}: {call} took over task.step_timeout_s={timeout_s:g} s (abandoned, still running)"
        raise EnvironmentCallFailed(message, STEP_TIMEOUT) from err
    except (asyncio.CancelledError, StoppedAtOnce, UserError):  # cancelled; the run's own stop; the user's config
        raise
    except (Exception, SystemExit) as err:  # sys.exit() in an environment fails its episode, not the run
        raise EnvironmentCallFailed(
            f"{label(name, env)}: {call} raised {raised(err)}", ENV_ERROR, type(err).__name__
        ) from err


def first_reset(make_env: Callable[[dict], Any], row: dict, name: str, timeout_s: float | None) -> Reset:
    """One environment made and reset on ``row``, then closed, before the first step (the start-up
    check reads the tools it offers). Played on a loop of its own in a daemon thread, so it works inside
    a running loop (a notebook's) and a hung reset never holds the process."""

    async def reset_and_close() -> Reset:
        env = made(make_env, row, name)
        try:
            reset = await call_environment(env, env.reset, 0, row, timeout_s=timeout_s, name=name)
            return returns.checked(name or type(env).__name__, "reset", reset)
        finally:
            try:
                await call_environment(env, env.close, timeout_s=timeout_s, name=name)
            except EnvironmentCallFailed:
                pass  # the reset's outcome is what matters here

    try:
        return in_daemon_thread(asyncio.run, reset_and_close(), name="env-start").result()
    except EnvironmentCallFailed as err:
        raise EnvironmentStartError(
            f"{err}, at start-up (one environment reset on the first row, before any step); every episode would "
            "fail the same way: fix the environment (or raise task.step_timeout_s if it is only slow)"
        ) from None
