"""Run a reward function in a worker process that is killed at ``task.reward_timeout_s`` (``task.reward_process``).

The trainer's own limit (:mod:`.deadline`) interrupts Python code, but not code stuck inside one
C call (a regex that backtracks forever): with ``task.reward_process`` each reward runs in its
own ``spawn``-ed process, killed when a call runs past the limit (a fresh one serves the next). The worker imports the function by
its module and name, as pickle would; a function from a plug-in file is loaded from that file.
A lambda or a nested function has no such name and is refused when the scorer is built.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import multiprocessing
import sys
from typing import Any

from grpo_lightning.errors import RewardError

LOG_CALLBACKS = ("log_extra", "log_metric")  # cannot cross the process boundary: recorded there, replayed here
STARTUP_LIMIT_S = 300.0  # importing the function's module (torch included) is not the call's time


def function_address(name: str, fn) -> tuple[str, str | None, str]:
    """(module, its file, qualified name) of ``fn``, or a RewardError saying why a worker cannot import it."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    owner = sys.modules.get(module or "")
    found = owner
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if owner is None or "<" in qualname or found is not fn:
        raise RewardError(
            f"reward function {name!r} cannot run under task.reward_process=true: a worker process imports it by "
            f"module and name, and {module}.{qualname} is not importable (a lambda, a nested function or an "
            f"object); define it at the top level of a module or plug-in file, or set task.reward_process=false"
        )
    return module, getattr(owner, "__file__", None), qualname


def _resolve(module: str, file: str | None, qualname: str):
    try:
        owner = importlib.import_module(module)
    except ImportError:
        if file is None:
            raise
        spec = importlib.util.spec_from_file_location(module, file)  # a plug-in file: no importable name
        owner = importlib.util.module_from_spec(spec)
        sys.modules[module] = owner
        spec.loader.exec_module(owner)
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


def _serve(conn, address: tuple[str, str | None, str]) -> None:
    """The worker: import the function, then answer calls until the parent closes the pipe."""
    try:
        fn = _resolve(*address)
    except BaseException as err:  # noqa: BLE001  (reported to the parent, which names the function)
        conn.send(("raised", type(err).__name__, str(err)))
        return
    conn.send(("ready", "", ""))
    while True:
        try:
            args, kwargs, callbacks = conn.recv()
        except EOFError:
            return
        logged: list[tuple[str, tuple]] = []  # log_metric / log_extra calls, replayed by the parent
        for callback in callbacks:
            kwargs[callback] = lambda *a, _name=callback, _to=logged: _to.append((_name, a))
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(value)
            conn.send(("ok", value, logged))
        except BaseException as err:  # noqa: BLE001  (SystemExit too: the parent stops the run, naming it)
            conn.send(("raised", type(err).__name__, str(err)))


class RewardWorkerError(RewardError):
    """The worker could not import the function, ran past the limit, or died; the message names the function."""


class RewardCallFailed(Exception):
    """The worker's function raised: ``kind`` is the exception's class name (it stays in the worker)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class IsolatedReward:
    """``fn`` called in a killable worker process, at most ``timeout_s`` seconds a call."""

    def __init__(self, name: str, fn, timeout_s: float, address: tuple[str, str | None, str] | None = None):
        """``address``: (module, file, attribute) to import ``fn`` by, when its own name does not lead to it."""
        self.name, self.timeout_s = name, float(timeout_s)
        self.address = address or function_address(name, fn)
        self.__wrapped__ = fn  # inspect.signature: the keyword arguments fn takes
        self._process = self._conn = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, self.address), daemon=True)
        self._process.start()
        child.close()
        status, kind, message = self._receive(STARTUP_LIMIT_S, "starting")
        if status != "ready":
            self.close()
            raise RewardWorkerError(
                f"reward function {self.name!r}: its worker process could not import it "
                f"({'.'.join(self.address[::2])}): {kind}: {message}"
            )

    def _receive(self, limit: float, doing: str) -> tuple:
        if not self._conn.poll(limit):
            self.close()
            raise RewardWorkerError(
                f"reward function {self.name!r} ran past task.reward_timeout_s={self.timeout_s:g} s while "
                f"{doing}; its worker process was killed. Make it faster, or raise the limit"
                if doing == "scoring"
                else f"reward function {self.name!r}: its worker process did not start within {limit:g} s"
            )
        try:
            return self._conn.recv()
        except EOFError:
            code = self._process.exitcode if self._process is not None else None
            self.close()
            raise RewardWorkerError(
                f"reward function {self.name!r} ended its worker process (exit code {code}) while {doing}"
            ) from None

    def __call__(self, *args, **kwargs) -> Any:
        if self._process is None or not self._process.is_alive():
            self._start()
        callbacks = {name: kwargs.pop(name) for name in LOG_CALLBACKS if name in kwargs}
        self._conn.send((args, kwargs, list(callbacks)))
        status, value, message = self._receive(self.timeout_s, "scoring")
        if status == "raised":
            raise RewardCallFailed(value, message)
        for name, arguments in message:  # what the function logged in the worker
            callbacks[name](*arguments)
        return value

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass
