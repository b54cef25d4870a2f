"""``Ledger``: which prompts of the pipeline are generating, finished, or resolved; who may be admitted.

Every group (a prompt's G samples) goes through: *admitted* (drawn from the stream in data order,
handed to the engine), *finished* (all G samples ended; kept in finish order), then *resolved* by
the trainer: trained, dropped (a token beyond ``rollout.max_off_policy_steps``) or filtered
(dynamic sampling: equal rewards). Groups are never split.

Admission is AReaL's capacity rule in batches: at batch ``b`` the groups trained so far plus those
admitted and not yet resolved stay below ``(max_lag + b + 1) x P``, so a group admitted now is
trained at batch ``b + max_lag`` at the latest, unless it is still generating then (a long tail,
which the bound at training time catches). ``max_in_flight`` caps the groups generating at once,
and the run's own need (``budget``: its batches x P) caps what is drawn at all: a run of N batches
draws exactly its N x P prompts, the sync run's, when nothing is dropped or filtered.

A checkpoint keeps the cursor (the next ordinal), the groups generating (their ordinals: generated
again after a resume, from the start) and the finished ones with their completions (trained as they
are): everything below the cursor and in neither list was resolved. So a resumed run neither drops
nor repeats a prompt. Thread-safe: the engine's threads finish groups while the trainer takes them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from grpo_lightning.records import Completion
from grpo_lightning.records.plain_state import from_plain, to_plain
from grpo_lightning.rollout.engine import GenerationRequest

RESOLUTIONS = ("trained", "dropped", "filtered")


@dataclass
class Group:
    """One prompt's G samples in the pipeline."""

    ordinal: int  # its place in the data order of this rank
    record: dict
    requests: list[GenerationRequest]
    admitted_version: int = 0  # the trainer's version when it was admitted
    completions: list[Completion] | None = None  # once finished
    finished_at: float = 0.0
    resolution: str | None = None  # one of RESOLUTIONS, once the trainer decided


class PipelineStalled(RuntimeError):
    """The trainer waits for a group that can never come (a bug, or an engine that lost requests)."""


@dataclass
class Ledger:
    """See the module docstring. ``make_group(ordinal)`` builds the group of a prompt (record, requests)."""

    make_group: Callable[[int], Group]
    prompts_per_step: int
    max_lag: int
    max_in_flight: int = 0  # 0: no cap but the capacity rule
    budget: int | None = None  # groups the run trains at most (batches x P); None: unbounded
    cursor: int = 0  # the next ordinal to draw
    trained: int = 0  # groups trained so far
    holding: int = 0  # groups the trainer took and has not resolved yet
    allowed: int = 0  # trained + pending below this (set per batch by open_batch)
    needed: int = 0  # trained + pending the open batch itself needs (a stop signal admits no more than this)
    version: int = 0  # the trainer's weight version, stamped on admitted groups
    stopping: Callable[[], bool] = lambda: False  # a stop signal: admit nothing beyond the open batch
    running: dict[int, Group] = field(default_factory=dict)
    finished: deque = field(default_factory=deque)
    reissue: deque = field(default_factory=deque)  # ordinals generating at the checkpoint: first again
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOLUTIONS, 0))
    error: BaseException | None = None
    closed: bool = False  # the end of training: admit nothing

    def __post_init__(self) -> None:
        self.cond = threading.Condition()

    # ----------------------------------------------------------------------- admission
    @property
    def pending(self) -> int:
        """Groups admitted and not resolved: generating, finished, or taken by the trainer."""
        return len(self.running) + len(self.finished) + self.holding

    def open_batch(self, batch: int, version: int) -> None:
        """Batch ``batch`` starts (batches before it trained); the trainer's weights are ``version``."""
        with self.cond:
            self.allowed = (self.max_lag + batch + 1) * self.prompts_per_step
            self.needed = (batch + 1) * self.prompts_per_step
            if self.budget is not None:
                self.allowed = min(self.allowed, self.budget)
            self.version = version

    def admissible(self) -> bool:
        """Whether one more group may be admitted now (call under ``cond``)."""
        if self.error is not None or self.closed:
            return False
        if self.max_in_flight and len(self.running) >= self.max_in_flight:
            return False
        # a stop signal: nothing runs ahead, but the open batch may still replace a dropped group
        return self.trained + self.pending < (min(self.allowed, self.needed) if self.stopping() else self.allowed)

    def admit(self) -> list[Group]:
        """Every group the rule admits now, in data order (re-issued ones first); marked generating."""
        admitted = []
        with self.cond:
            while self.admissible():
                ordinal = self.reissue.popleft() if self.reissue else self.cursor
                if ordinal == self.cursor:
                    self.cursor += 1
                group = self.make_group(ordinal)
                group.admitted_version = self.version
                self.running[ordinal] = group
                admitted.append(group)
        return admitted

    # ----------------------------------------------------------------------- the engine's side
    def finish(self, ordinal: int, completions: list[Completion]) -> None:
        """All samples of group ``ordinal`` ended (called from an engine thread)."""
        with self.cond:
            group = self.running.pop(ordinal, None)
            if group is None:  # abandoned (closed) meanwhile
                return
            group.completions, group.finished_at = completions, time.perf_counter()
            self.finished.append(group)
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The engine failed: the trainer's next wait raises it."""
        with self.cond:
            self.error = error
            self.cond.notify_all()

    # ----------------------------------------------------------------------- the trainer's side
    def next_finished(self, timeout_s: float | None = None) -> Group:
        """The next group to finish (in finish order), waiting for it."""
        with self.cond:
            while not self.finished:
                if self.error is not None:
                    raise self.error
                if not self.running and not self.reissue and not self.admissible():
                    raise PipelineStalled(
                        f"the pipeline has nothing generating and may admit nothing (trained {self.trained}, "
                        f"allowed {self.allowed}, cursor {self.cursor}) while the trainer waits for a group"
                    )
                if not self.cond.wait(timeout=timeout_s):
                    raise TimeoutError(f"no group finished within {timeout_s:g} s")
            self.holding += 1
            return self.finished.popleft()

    def resolve(self, group: Group, how: str) -> None:
        """The trainer trained, dropped or filtered ``group`` (or changed its mind: a filtered group that tops
        a batch up is trained after all); what is admitted next may replace it."""
        with self.cond:
            if group.resolution is None:
                self.holding -= 1
            else:
                self.counts[group.resolution] -= 1
                self.trained -= group.resolution == "trained"
            group.resolution = how
            self.counts[how] += 1
            self.trained += how == "trained"

    # ----------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Plain data: the cursor, the ordinals generating, the finished groups with their completions."""
        with self.cond:
            generating = sorted([*self.running, *self.reissue])
            finished = [
                {"ordinal": g.ordinal, "version": g.admitted_version, "completions": [asdict(c) for c in g.completions]}
                for g in self.finished
            ]
            state = {"cursor": self.cursor, "trained": self.trained, "generating": generating, "finished": finished}
            state["counts"] = dict(self.counts)
        return to_plain(state, "the pipeline's prompts")

    def load_state_dict(self, state: dict) -> None:
        state = from_plain(state)
        with self.cond:
            self.cursor, self.trained = int(state["cursor"]), int(state["trained"])
            self.counts.update({k: int(v) for k, v in state.get("counts", {}).items()})
            self.reissue = deque(int(o) for o in state["generating"])
            self.running.clear()
            self.finished.clear()
            for saved in state["finished"]:
                group = self.make_group(int(saved["ordinal"]))
                group.admitted_version = int(saved["version"])
                group.completions = [Completion(**c) for c in saved["completions"]]
                self.finished.append(group)

    def start_at(self, ordinal: int) -> None:
        """No state to resume (a fresh run, or a checkpoint of a sync run): the prompts before ``ordinal``
        were trained."""
        with self.cond:
            if not self.cursor and not self.trained and not self.reissue and not self.finished:
                self.cursor = self.trained = ordinal
