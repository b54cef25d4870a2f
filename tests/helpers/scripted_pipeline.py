"""A scripted streaming engine for the pipeline's property tests: no model, exact bookkeeping.

Its thread decodes every sequence in flight one token per tick, with random pauses between ticks
(seeded), and takes new weights between two ticks as the HF pipeline engine does. Its "weights"
are one number (the value of the tensor the trainer pushes); the token a tick emits is
``3 + that number`` and its log-prob ``-that number / 10``: every token says which weights produced
it, independently of the version the engine records. A request's length is fixed by its seed
(``1 + seed % max_new_tokens``), so groups finish in an order no one chose.
"""

from __future__ import annotations

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


class ScriptedStreamingEngine(EngineBase):
    owns_weights = True
    streams = True

    def __init__(self, seed: int = 0, max_pause_s: float = 0.002, eos_token_id: int = 2):
        self.random = random.Random(seed)
        self.max_pause_s = max_pause_s
        self.eos_token_id = eos_token_id
        self.value = 0  # the weights' number
        self.version = 0
        self.applied: list[tuple[int, int]] = []  # (version, tick) of every swap
        self.tick = 0
        self._clock = EngineClock()
        self._cond = threading.Condition()
        self._live: list[dict] = []  # sequences in flight
        self._swap = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="scripted-engine", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------- the protocol
    def submit(self, requests, sampling, done, failed) -> None:
        group = {"left": len(requests), "out": [None] * len(requests), "done": done}
        with self._cond:
            for i, request in enumerate(requests):
                length = 1 + request.seed % sampling.max_new_tokens
                self._live.append({"group": group, "i": i, "length": length, "tokens": [], "logp": [], "v": []})
            self._cond.notify_all()

    def generate(self, requests, sampling):
        finished, box = threading.Event(), {}
        self.submit(requests, sampling, lambda out: (box.setdefault("out", out), finished.set()), None)
        finished.wait()
        return box["out"]

    def load_weights(self, named_tensors, version=None) -> float:
        value = int(float(dict(named_tensors)["w"]))
        applied = threading.Event()
        with self._cond:
            self._swap = (value, version, applied)
            self._cond.notify_all()
        applied.wait()
        return 0.0

    def clock(self):
        return self._clock.read()

    def cancel(self) -> None:
        with self._cond:
            self._live.clear()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def sequence_logprobs(self, prompt_ids, completion_ids):
        return [-self.value / 10] * len(completion_ids)

    # ----------------------------------------------------------------------- the loop
    def _run(self) -> None:
        while True:
            finished = []
            with self._cond:
                if self._swap is not None:
                    self._clock.switch("sync")
                    self.value, self.version, applied = self._swap
                    self._swap = None
                    self.applied.append((self.version, self.tick))
                    applied.set()
                while not self._live and self._swap is None and not self._stop:
                    self._clock.switch("idle")
                    self._cond.wait()
                if self._stop:
                    return
                if self._swap is not None:
                    continue
                self._clock.switch("busy")
                self.tick += 1
                for seq in self._live:
                    seq["tokens"].append(3 + self.value)
                    seq["logp"].append(-self.value / 10)
                    seq["v"].append(self.version)
                for seq in [s for s in self._live if len(s["tokens"]) >= s["length"]]:
                    self._live.remove(seq)
                    group = seq["group"]
                    group["out"][seq["i"]] = Completion(
                        token_ids=seq["tokens"],
                        finished=False,
                        logprobs=seq["logp"],
                        weight_version=min(seq["v"]),
                        token_weight_versions=seq["v"],
                    )
                    group["left"] -= 1
                    if not group["left"]:
                        finished.append(group)
            for group in finished:  # outside the lock: the callback may submit more
                group["done"](group["out"])
            time.sleep(self.random.uniform(0, self.max_pause_s))
