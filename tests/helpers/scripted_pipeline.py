"""Streaming engines without a model, for the pipeline's property tests and its simulator.

:class:`TickingEngine` is the shared loop: a thread that decodes every sequence in flight one token
per tick, seats waiting requests into at most ``rows`` sequences, takes new weights between two
ticks as the HF pipeline engine does, and keeps the busy / idle / sync clock. Subclasses say how
long a request runs, what a tick emits, and how long the engine waits between ticks.

:class:`ScriptedStreamingEngine` (the property tests): its "weights" are one number (the value of the
tensor the trainer pushes); the token a tick emits is ``3 + that number`` and its log-prob ``-that
number / 10``: every token says which weights produced it, independently of the version the engine
records. A request's length is fixed by its seed (``1 + seed % max_new_tokens``), and the pauses
between ticks are random (seeded), so groups finish in an order no one chose.
"""

from __future__ import annotations

import math
import random
import threading
import time

from grpo_lightning.records import Completion
from grpo_lightning.rollout.engine import EngineBase
from grpo_lightning.rollout.pipeline.engine import EngineClock


def version_tensor(version: int):
    """The weights a scripted trainer pushes at ``version``: one number that the tokens will show."""
    import torch  # noqa: PLC0415  (kept out of xdist's controller)

    return [("w", torch.tensor(float(version % 13)))]


class TickingEngine(EngineBase):
    """The loop of a model-free streaming engine (module docstring); ``rows`` sequences at most."""

    owns_weights = True
    streams = True
    finished_flag = False  # Completion.finished of what it returns
    sync_s = 0.0  # seconds a weight swap takes

    def __init__(self, rows: float = math.inf, name: str = "ticking-engine"):
        self.rows = rows
        self.version = 0
        self.tick = 0
        self._clock = EngineClock()
        self._cond = threading.Condition()
        self._waiting: list[dict] = []  # requests not seated yet
        self._live: list[dict] = []  # sequences in flight
        self._swap = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------- what a subclass says
    def length(self, request, sampling) -> int:
        """Tokens the request runs for."""
        raise NotImplementedError

    def weights_of(self, named_tensors) -> object:
        """What of the pushed weights the engine keeps (passed to ``apply``)."""
        return None

    def apply(self, weights: object, version: int | None) -> None:
        """Take new weights (under the lock, between two ticks)."""
        self.version = version

    def emit(self, seq: dict) -> None:
        """Append a token to ``seq`` (its ``tokens``, ``logp`` and ``v`` lists)."""
        raise NotImplementedError

    def pause(self) -> None:
        """Between two ticks, outside the lock."""

    # ----------------------------------------------------------------------- the protocol
    def submit(self, requests, sampling, done, failed) -> None:
        group = {"left": len(requests), "out": [None] * len(requests), "done": done}
        with self._cond:
            for i, request in enumerate(requests):
                length = self.length(request, sampling)
                self._waiting.append({"group": group, "i": i, "length": length, "tokens": [], "logp": [], "v": []})
            self._cond.notify_all()

    def generate(self, requests, sampling):
        finished, box = threading.Event(), {}
        self.submit(requests, sampling, lambda out: (box.setdefault("out", out), finished.set()), None)
        finished.wait()
        return box["out"]

    def load_weights(self, named_tensors, version=None) -> float:
        applied = threading.Event()
        with self._cond:
            self._swap = (self.weights_of(named_tensors), version, applied)
            self._cond.notify_all()
        applied.wait()
        return self.sync_s

    def clock(self):
        return self._clock.read()

    def cancel(self) -> None:
        with self._cond:
            self._waiting.clear()
            self._live.clear()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # ----------------------------------------------------------------------- the loop
    def _run(self) -> None:
        while True:
            finished = []
            with self._cond:
                if self._swap is not None:
                    self._clock.switch("sync")
                    weights, version, applied = self._swap
                    self._swap = None
                    self.apply(weights, version)
                    applied.set()
                while not self._live and not self._waiting and self._swap is None and not self._stop:
                    self._clock.switch("idle")
                    self._cond.wait()
                if self._stop:
                    return
                if self._swap is not None:
                    continue
                self._clock.switch("busy")
                self.tick += 1
                while self._waiting and len(self._live) < self.rows:
                    self._live.append(self._waiting.pop(0))
                for seq in self._live:
                    self.emit(seq)
                for seq in [s for s in self._live if len(s["v"]) >= s["length"]]:
                    self._live.remove(seq)
                    group = seq["group"]
                    group["out"][seq["i"]] = Completion(
                        token_ids=seq["tokens"],
                        finished=self.finished_flag,
                        logprobs=seq["logp"],
                        weight_version=min(seq["v"]),
                        token_weight_versions=seq["v"],
                    )
                    group["left"] -= 1
                    if not group["left"]:
                        finished.append(group)
            for group in finished:  # outside the lock: the callback may submit more
                group["done"](group["out"])
            self.pause()


class ScriptedStreamingEngine(TickingEngine):
    """See the module docstring."""

    def __init__(self, seed: int = 0, max_pause_s: float = 0.002, eos_token_id: int = 2):
        self.random = random.Random(seed)
        self.max_pause_s = max_pause_s
        self.eos_token_id = eos_token_id
        self.value = 0  # the weights' number
        self.applied: list[tuple[int, int]] = []  # (version, tick) of every swap
        super().__init__(name="scripted-engine")

    def length(self, request, sampling) -> int:
        return 1 + request.seed % sampling.max_new_tokens

    def weights_of(self, named_tensors) -> int:
        return int(float(dict(named_tensors)["w"]))

    def apply(self, weights: int, version: int | None) -> None:
        self.value, self.version = weights, version
        self.applied.append((version, self.tick))

    def emit(self, seq: dict) -> None:
        seq["tokens"].append(3 + self.value)
        seq["logp"].append(-self.value / 10)
        seq["v"].append(self.version)

    def pause(self) -> None:
        time.sleep(self.random.uniform(0, self.max_pause_s))

    def sequence_logprobs(self, prompt_ids, completion_ids):
        return [-self.value / 10] * len(completion_ids)
