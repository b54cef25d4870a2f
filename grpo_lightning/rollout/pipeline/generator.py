"""``PipelineRolloutGenerator``: the engine never waits for the trainer (``rollout.mode=pipeline``).

A producer keeps the engine fed: whenever the ledger's capacity rule allows
(:mod:`~grpo_lightning.rollout.pipeline.ledger`), the next prompts of the data order are admitted
and their groups submitted to a :class:`~grpo_lightning.rollout.pipeline.engine.StreamingEngine`,
which generates them beside the ones already in flight. Admission runs on events (a batch opens, a
group finishes or is resolved), so the producer's work happens on the engine's threads and the
trainer's; it holds no thread of its own. The trainer's batch is the next ``prompts_per_step``
groups to *finish* (never a split group): it waits only when none is finished. After the step, the
weight sync hands the new weights to the engine, which takes them between two decode steps and goes
on with the same sequences (partial rollouts): a sequence's tokens may come from several versions,
each recorded per token.

At training time the staleness bound of ``rollout.max_off_policy_steps`` applies per token, as in
async mode (:func:`~grpo_lightning.rollout.async_generator.bound_staleness`): a group with a token
beyond it is dropped (``off_policy_action=drop``: counted, and replaced by the next prompt) or the
token is masked (``mask``). Dynamic sampling filters finished groups whose rewards are all equal and
takes the next ones (at most ``max_sampling_rounds`` rounds, then tied groups top the batch up).
The corrections and ``mismatch/*`` read each token's engine log-prob, the one it was sampled with.

Exactness: each prompt's seeds are the sync run's, and the prompts trained are the data order's
(those of a sync run of as many steps, when no group is dropped or filtered), also across a
SIGKILL and ``trainer.resume=auto``. The completions and the grouping into steps are not
reproducible: where the weights change inside a sequence depends on timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch.distributed as dist
from torch import nn

from grpo_lightning.algorithm import tied_groups
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.async_generator import bound_staleness, token_lags
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import GenerationRequest
from grpo_lightning.rollout.generator import RolloutGenerator, engine_context
from grpo_lightning.rollout.pipeline.engine import ClockReading, StreamingEngine
from grpo_lightning.rollout.pipeline.ledger import Group, Ledger
from grpo_lightning.rollout.pipeline.metrics import PREFIX, time_metrics, version_metrics
from grpo_lightning.rollout.pipeline.stream import PromptStream

StreamFactory = Callable[[int, int], PromptStream]  # (rank, world) -> this rank's prompts in data order


class PipelineRolloutGenerator(RolloutGenerator):
    """A :class:`RolloutGenerator` fed by a producer that never waits for the trainer (module docstring)."""

    def __init__(
        self,
        *args,
        max_lag: int = 1,
        max_in_flight: int = 0,
        max_off_policy_steps: int = 8,
        off_policy_action: str = "drop",
        max_sampling_rounds: int = 3,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.max_lag, self.max_in_flight = max_lag, max_in_flight
        self.max_off_policy_steps, self.off_policy_action = max_off_policy_steps, off_policy_action
        self.max_sampling_rounds = max_sampling_rounds
        self.filter_tied = False  # dynamic sampling (rollout.dynamic_sampling), set by build_run
        self.streams: StreamFactory | None = None  # set by build_run (the data module's order)
        self.budget_batches: int | None = None  # the run's batches: it draws no more prompts than they train
        self.stopping: Callable[[], bool] = lambda: False  # a stop signal: nothing runs ahead of the open batch
        self.trainer_version: int | None = None  # the trainer's optimizer step, set by the module before each batch
        self.ledger: Ledger | None = None
        self._saved: dict | None = None  # a checkpoint's ledger, loaded before the first batch
        self._mark: tuple[float, ClockReading] | None = None  # the end of the last batch's collection

    def setup(self, policy: nn.Module) -> None:
        super().setup(policy)
        if self.vision is not None:  # a policy handed in from Python (the CLI's config check says it first)
            raise TypeError("rollout.mode=pipeline decodes text prompts only; a vision-language policy needs mode=sync")
        if not (isinstance(self.engine, StreamingEngine) and getattr(self.engine, "streams", False)):
            raise TypeError(
                f"rollout.mode=pipeline needs an engine that takes requests and weights between decode steps; "
                f"{type(self.engine).__name__} does not (rollout.engine=hf, or a launched vLLM server)"
            )

    # ----------------------------------------------------------------------- the producer
    def _start(self, step: int, rank: int) -> None:
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if self.streams is None:
            raise RuntimeError("PipelineRolloutGenerator has no prompt stream: build_run sets generator.streams")
        stream = self.streams(rank, world)
        P = stream.prompts_per_step
        self.ledger = Ledger(
            partial(self._make_group, stream, rank),
            P,
            self.max_lag,
            self.max_in_flight,
            budget=self.budget_batches * P if self.budget_batches else None,
            stopping=self.stopping,
        )
        if self._saved is not None:
            self.ledger.load_state_dict(self._saved)
        else:
            self.ledger.start_at(step * P)  # a fresh run, or one resumed from a sync run's checkpoint
        self._mark = (time.perf_counter(), self.engine.clock())

    def _make_group(self, stream: PromptStream, rank: int, ordinal: int) -> Group:
        record = stream.record(ordinal)
        ids, vision = self.prompt_inputs(record)
        seeds = stream.seeds(self.seed, rank, ordinal, self.num_generations)
        return Group(ordinal, record, [GenerationRequest(ids, seed, vision) for seed in seeds])

    def fill(self) -> None:
        """Admit what the capacity rule allows and hand it to the engine (on every event that frees room)."""
        ledger = self.ledger
        if ledger is None:
            return
        for group in ledger.admit():
            self.engine.submit(group.requests, self.sampling, partial(self._finished, group.ordinal), ledger.fail)

    def _finished(self, ordinal: int, completions) -> None:
        self.ledger.finish(ordinal, completions)
        self.fill()  # a slot of max_in_flight is free

    # ----------------------------------------------------------------------- the trainer's batch
    def rollout_for_step(self, batch, step: int, rank: int) -> RolloutBatch:
        if self.ledger is None:
            self._start(step, rank)
        now = self.trainer_version if self.trainer_version is not None else step
        self.ledger.open_batch(step, now)
        self.fill()
        with engine_context(step, rank):
            groups, counts, wait = self._collect(step, now)
        completions = [c for g in groups for c in g.completions]
        records = [g.record for g in groups]
        requests = [r for g in groups for r in g.requests]
        end, clock = time.perf_counter(), self.engine.clock()
        started, before = self._mark
        self._mark = (end, clock)
        engine = clock.minus(before)
        rollout = self.assemble(records, requests, completions, step, max(engine.busy, 1e-9))
        rollout.timing.update(counts)
        rollout.timing.update(version_metrics(completions, now))
        rollout.timing.update(time_metrics(end - started, wait, engine))
        rollout.timing["rollout/wait_seconds"] = wait
        rollout.timing[PREFIX + "in_flight"] = float(len(self.ledger.running))
        rollout.timing[PREFIX + "finished_waiting"] = float(len(self.ledger.finished))
        return rollout

    def _collect(self, step: int, now: int) -> tuple[list[Group], dict[str, float], float]:
        """The next finished groups, the over-stale ones dropped (or their stale tokens masked) and, with
        dynamic sampling, the tied ones filtered (at most ``max_sampling_rounds`` rounds, then the earliest
        tied groups top the batch up), until the batch holds ``prompts_per_step`` of them."""
        P, ledger = self.ledger.prompts_per_step, self.ledger
        kept: list[Group] = []
        tied: list[Group] = []
        counts = {"rollout/staleness_max": 0.0, "rollout/off_policy_dropped": 0.0}
        counts.update({"rollout/off_policy_masked_tokens": 0.0, PREFIX + "dropped_groups": 0.0})
        counts[PREFIX + "filtered_groups"] = 0.0
        wait, rounds = 0.0, 0
        while len(kept) < P:
            rounds += 1
            if self.filter_tied and rounds > self.max_sampling_rounds:
                kept += tied[: P - len(kept)]
                break
            candidates: list[Group] = []
            while len(kept) + len(candidates) < P:
                start = time.perf_counter()
                group = ledger.next_finished()
                wait += time.perf_counter() - start
                if self._within_bound(group, now, counts):
                    candidates.append(group)
                else:
                    ledger.resolve(group, "dropped")
                    self.fill()
            if self.filter_tied:
                candidates, ties = self._split_tied(candidates, step)
                for group in ties:  # resolved now: their room goes to the next prompts
                    ledger.resolve(group, "filtered")
                tied += ties
                self.fill()
            kept += candidates
        for group in kept:
            ledger.resolve(group, "trained")
        counts[PREFIX + "filtered_groups"] = float(sum(g.resolution == "filtered" for g in tied))
        self.fill()
        return kept, counts, wait

    def _within_bound(self, group: Group, now: int, counts: dict[str, float]) -> bool:
        """Apply the per-token staleness bound to a finished group; False: dropped (counted)."""
        lags = [lag for c in group.completions for lag in token_lags(c, now)]
        counts["rollout/staleness_max"] = max(counts["rollout/staleness_max"], float(max(lags, default=0)))
        if max(lags, default=0) <= self.max_off_policy_steps:
            return True
        if self.off_policy_action == "drop":
            counts["rollout/off_policy_dropped"] += len(group.completions)
            counts[PREFIX + "dropped_groups"] += 1
            return False
        _, group.completions, masked = bound_staleness(
            group.completions, len(group.completions), now, self.max_off_policy_steps, "mask"
        )
        counts["rollout/off_policy_masked_tokens"] += masked["rollout/off_policy_masked_tokens"]
        return True

    def _split_tied(self, groups: list[Group], step: int) -> tuple[list[Group], list[Group]]:
        """Dynamic sampling: the groups whose rewards differ, and those whose rewards are all equal."""
        if not groups:
            return [], []
        scored = self.assemble(
            [g.record for g in groups],
            [r for g in groups for r in g.requests],
            [c for g in groups for c in g.completions],
            step,
            0.0,
        )
        flags = tied_groups(scored.rewards, self.num_generations).tolist()
        return [g for g, t in zip(groups, flags, strict=True) if not t], [
            g for g, t in zip(groups, flags, strict=True) if t
        ]

    # ----------------------------------------------------------------------- weights, checkpoints, the end
    def sync_weights(self, weights: PolicyWeights, expected=None, rank: int = 0) -> dict[str, float]:
        """The new weights reach the engine at its next safe point; the sequences in flight go on with them."""
        return super().sync_weights(weights, expected, rank)

    def state_dict(self) -> dict:
        """The pipeline's prompts: the cursor, the groups generating (generated again on resume), the finished
        ones with their completions (trained as they are). Plain data."""
        return {"ledger": self.ledger.state_dict() if self.ledger is not None else self._saved}

    def load_state_dict(self, state_dict: dict) -> None:
        self._saved = state_dict.get("ledger")

    def close(self) -> None:
        """Stop admitting and drop the groups in flight (the engine stays up for a final evaluation)."""
        if self.ledger is not None:
            with self.ledger.cond:
                self.ledger.closed = True
        cancel = getattr(self.engine, "cancel", None)
        if cancel is not None:
            cancel()
