"""``AsyncRolloutGenerator``: generate the next batches in the background while the module trains.

At step t the generator queues the generation of step t + k (k = ``max_staleness``, prompts
from the :class:`~grpo_lightning.data.lookahead.PromptWindow`) on the engine's worker thread,
then takes step t's batch, queued k steps earlier. The engine runs every call in submission
order, so the weight sync at the end of step t runs after the generation queued at its
start: the batch of step t + k is sampled with the weights of step t, exactly k optimizer
steps stale, on every run. Same staleness, same samples.

F1 (identical completions in async generation) cannot come from here: requests are built by
:meth:`RolloutGenerator.build_requests` with the seeds of the step each batch is *for*, the
same derivation as in sync mode, never one fixed seed.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass

from torch import nn

from grpo_lightning.data.lookahead import PromptWindow
from grpo_lightning.plain_state import RefusedState, from_plain, to_plain
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import Completion, GenerationRequest
from grpo_lightning.rollout.generator import RolloutGenerator, engine_context


@dataclass
class PendingGeneration:
    """A generation batch queued on the engine and not yet trained on."""

    records: list[dict]
    requests: list[GenerationRequest]
    future: Future
    submitted_at_step: int


class AsyncRolloutGenerator(RolloutGenerator):
    """A :class:`RolloutGenerator` whose engine works ``max_staleness`` steps ahead of training."""

    def __init__(self, *args, max_staleness: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        if max_staleness < 1:
            raise ValueError(f"max_staleness={max_staleness} must be >= 1")
        self.max_staleness = max_staleness
        self.pending: dict[int, PendingGeneration] = {}

    def setup(self, policy: nn.Module) -> None:
        super().setup(policy)
        if not self.engine.supports_async:
            raise TypeError(
                f"rollout.mode=async needs an engine that generates in the background (VLLMEngine); "
                f"{type(self.engine).__name__} does not"
            )

    def submit(self, records: list[dict], step: int, rank: int, now: int) -> None:
        """Queue the generation of ``step`` (once); its seeds are those of ``step``."""
        if step in self.pending:
            return
        requests = self.build_requests(records, step, rank)
        future = self.engine.generate_async(requests, self.sampling)
        self.pending[step] = PendingGeneration(records, requests, future, submitted_at_step=now)

    def rollout_for_step(self, batch, step: int, rank: int) -> RolloutBatch:
        if not isinstance(batch, PromptWindow):
            raise TypeError(
                "rollout.mode=async needs batches that carry the next steps' prompts: build the "
                "PromptDataModule with lookahead=rollout.max_staleness (build_run does)"
            )
        self.submit(batch.current, step, rank, now=step)  # only the first steps (or after a resume)
        for offset, records in enumerate(batch.ahead[: self.max_staleness], start=1):
            self.submit(records, step + offset, rank, now=step)
        pending = self.pending.pop(step)
        wait_start = time.perf_counter()
        with engine_context(step, rank):
            completions = pending.future.result()
        wait_seconds = time.perf_counter() - wait_start
        generation_seconds = getattr(pending.future, "timing", {}).get("seconds", wait_seconds)
        rollout = self.assemble(pending.records, pending.requests, completions, step, generation_seconds)
        rollout.timing["rollout/wait_seconds"] = wait_seconds
        rollout.timing["rollout/staleness"] = float(step - pending.submitted_at_step)
        return rollout

    # ----------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """The generations in flight (queued, not yet trained on), waited for and kept as they
        came out: a resumed run trains on exactly these, sampled with the older weights the
        uninterrupted run used, so it continues identically. Plain data: it loads without running code."""
        saved = [
            {
                "step": step,
                "records": p.records,
                "requests": [asdict(r) for r in p.requests],
                "completions": [asdict(c) for c in p.future.result()],
                "submitted_at_step": p.submitted_at_step,
            }
            for step, p in self.pending.items()
        ]
        return {"pending": to_plain(saved, "the generations in flight")}

    def load_state_dict(self, state_dict: dict) -> None:
        if not isinstance(state_dict["pending"], list):
            raise RefusedState.pickled("state of the generations in flight")
        for saved in from_plain(state_dict["pending"]):
            future: Future = Future()
            future.set_result([Completion(**c) for c in saved["completions"]])
            requests = [GenerationRequest(**r) for r in saved["requests"]]
            self.pending[saved["step"]] = PendingGeneration(
                saved["records"], requests, future, saved["submitted_at_step"]
            )

    def close(self) -> None:
        """Wait for queued generations and drop them (end of training, or an exception)."""
        for pending in self.pending.values():
            pending.future.exception()  # waits; an error here is not this run's to raise
        self.pending.clear()
