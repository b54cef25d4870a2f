"""A deadline for a weight sync that holds even when the sync is stuck inside a collective.

NCCL collectives ignore their own timeouts and a blocked gloo receive or HTTP call may wait far
longer than the user allows, so the deadline cannot be enforced from inside the call. The sync
runs on a daemon thread; the caller waits on it for ``timeout_s`` at most, then calls ``abort``
(which tears down the process group or connection the sync is blocked in), raises
:class:`SyncTimeout`, and leaves the thread behind. ``cancelled`` tells the abandoned thread not
to commit anything (a version bump) should it wake up later.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from grpo_lightning.rollout.server_guard import VLLMServerError

T = TypeVar("T")


class SyncTimeout(VLLMServerError):
    """A weight sync did not finish within ``rollout.vllm.sync.timeout_s`` and was aborted."""


class SyncAttempt:
    """One sync run under a deadline: ``run`` returns its value, or raises its error or a timeout."""

    def __init__(self, what: str, timeout_s: float, abort: Callable[[], None] | None = None):
        self.what, self.timeout_s, self.abort = what, timeout_s, abort
        self.cancelled = threading.Event()  # set once the caller gave up: the sync must not commit

    def run(self, fn: Callable[[SyncAttempt], T]) -> T:
        outcome: dict[str, object] = {}
        done = threading.Event()

        def target() -> None:
            try:
                outcome["value"] = fn(self)
            except BaseException as err:  # handed to the waiting caller
                outcome["error"] = err
            finally:
                done.set()

        threading.Thread(target=target, daemon=True, name="grpo-weight-sync").start()
        if not done.wait(self.timeout_s):
            self.cancelled.set()
            aborted = self._abort()
            raise SyncTimeout(
                f"{self.what} did not finish within rollout.vllm.sync.timeout_s={self.timeout_s:g} s and was "
                f"aborted{aborted}; the engine keeps its previous weight version (a slow link or large model: "
                f"raise the timeout; a hang: check the server's log and the trainer-server network)"
            )
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["value"]  # type: ignore[return-value]

    def _abort(self) -> str:
        if self.abort is None:
            return ""
        try:
            self.abort()
        except Exception as err:  # the abort is best effort; the timeout is what the user must see
            return f" (the abort itself failed: {type(err).__name__}: {err})"
        return ""

    def check_not_cancelled(self) -> None:
        """Called before committing: a sync the caller already gave up on must not bump the version."""
        if self.cancelled.is_set():
            raise SyncTimeout(f"{self.what} finished after its deadline; not committed")
