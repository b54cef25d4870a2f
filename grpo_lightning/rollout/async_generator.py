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

Bounded staleness (``rollout.max_off_policy_steps``, prime-rl's ``max_off_policy_steps``,
AReaL's ``max_head_offpolicyness``): a token sampled by weight version ``v`` and trained at
step ``t`` is ``t - v`` steps off-policy. The admission rule queues step ``s`` ahead only if
``(s - t) + (v_trainer - v_pushed) + delay <= bound`` at step ``t``, where ``v_pushed`` is the
version last pushed to the engine and ``delay`` how far the engine's reported versions fell
behind the expected ones on the last batch (a slow engine); 0 queues nothing ahead
(synchronous generation). What still
arrives beyond the bound (the engine lagged more) is dropped by whole groups, counted in
``rollout/off_policy_dropped``, or with ``rollout.off_policy_action=mask`` kept out of the
loss token by token (``rollout/off_policy_masked_tokens``).

Episodes (``generator.episodes``, a task played in an environment) are played the same way: the
batch of step t + k is played in a background thread of the generator's while step t trains,
its turns queued on the engine between the weight syncs, so the turns of one episode may be
sampled by different versions. Each sampled token carries the version of its turn
(``Episode.versions``) and the bound applies per token, as above. A checkpoint does not keep
episodes in flight: a resumed run plays them again, with the weights it resumed with.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

from torch import nn

from grpo_lightning.config.rollout import OFF_POLICY_ACTIONS
from grpo_lightning.data.lookahead import PromptWindow
from grpo_lightning.records import PolicyWeights
from grpo_lightning.records.plain_state import RefusedState, from_plain, to_plain
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import Completion, GenerationRequest
from grpo_lightning.rollout.generator import RolloutGenerator, engine_context


def token_lags(completion: Completion, now: int) -> list[int]:
    """Steps between the weights that sampled each token and ``now`` (0 where the engine did not say)."""
    versions = completion.versions() or [-1] * len(completion.token_ids)
    return [now - v if v >= 0 else 0 for v in versions]


def bound_staleness(
    completions: list[Completion], group_size: int, now: int, bound: int, action: str = "drop"
) -> tuple[list[int], list[Completion], dict[str, float]]:
    """Apply the staleness bound: the indices of the completions kept, the completions (masked
    where ``action`` is mask), and the counts to log. ``drop`` removes every group with a token
    beyond ``bound`` (a GRPO group is compared whole); if that leaves no group, the batch stays
    with its stale samples out of the loss (still counted as dropped: the step learns nothing from them)."""
    lags = [token_lags(c, now) for c in completions]
    over = [[lag > bound for lag in row] for row in lags]
    counts = {
        "rollout/staleness_max": float(max((max(row, default=0) for row in lags), default=0)),
        "rollout/off_policy_dropped": 0.0,
        "rollout/off_policy_masked_tokens": 0.0,
    }
    stale_groups = {i // group_size for i, row in enumerate(over) if any(row)}
    keep = [i for i in range(len(completions)) if i // group_size not in stale_groups]
    if action == "drop" and keep:
        counts["rollout/off_policy_dropped"] = float(len(completions) - len(keep))
        return keep, [completions[i] for i in keep], counts
    if action == "drop":
        counts["rollout/off_policy_dropped"] = float(sum(any(row) for row in over))
    masked = []
    for c, row in zip(completions, over, strict=True):
        if any(row):
            base = c.loss_mask or [1] * len(c.token_ids)
            c = replace(c, loss_mask=[int(m and not o) for m, o in zip(base, row, strict=True)])
            counts["rollout/off_policy_masked_tokens"] += sum(row)
        masked.append(c)
    return list(range(len(completions))), masked, counts


@dataclass
class PendingGeneration:
    """A generation batch queued on the engine and not yet trained on."""

    records: list[dict]
    requests: list[GenerationRequest]
    future: Future
    submitted_at_step: int
    expected_version: int = -1  # the weight version it should be sampled with (the last pushed one); -1: unknown


class AsyncRolloutGenerator(RolloutGenerator):
    """A :class:`RolloutGenerator` whose engine works ``max_staleness`` steps ahead of training."""

    def __init__(
        self, *args, max_staleness: int = 1, max_off_policy_steps: int = 8, off_policy_action: str = "drop", **kwargs
    ):
        super().__init__(*args, **kwargs)
        if max_staleness < 1:
            raise ValueError(f"max_staleness={max_staleness} must be >= 1")
        if max_off_policy_steps < 0 or off_policy_action not in OFF_POLICY_ACTIONS:
            raise ValueError(
                f"max_off_policy_steps={max_off_policy_steps} must be >= 0, action one of {OFF_POLICY_ACTIONS}"
            )
        self.max_staleness = max_staleness
        self.max_off_policy_steps = max_off_policy_steps
        self.off_policy_action = off_policy_action
        self.pending: dict[int, PendingGeneration] = {}
        self.pushed_version: int | None = None  # the version of the last weight sync queued on the engine
        self.engine_delay = 0  # how far the engine's versions fell behind the expected ones (last batch)
        self.trainer_version: int | None = None  # the trainer's optimizer step, set by the module before each batch
        self._players: ThreadPoolExecutor | None = None  # plays episode batches in submission order

    def version_now(self, step: int) -> int:
        """The trainer's weight version (its optimizer step; the batch count where nobody said)."""
        return self.trainer_version if self.trainer_version is not None else step

    def admits(self, offset: int, step: int) -> bool:
        """The admission rule: queue the batch ``offset`` steps ahead only if it will be within the
        bound when trained: ``offset`` more steps, plus how far the engine already is behind."""
        now = self.version_now(step)
        behind = now - (self.pushed_version if self.pushed_version is not None else now)
        return offset + behind + self.engine_delay <= self.max_off_policy_steps

    def sync_weights(self, weights: PolicyWeights, expected=None, rank: int = 0) -> dict[str, float]:
        self.pushed_version = weights.version
        return super().sync_weights(weights, expected, rank)

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
        if self.episodes is not None:
            if self._players is None:
                self._players = ThreadPoolExecutor(1, thread_name_prefix="episode-batches")
            requests, future = [], self._players.submit(self._play_timed, records, step, rank)
        else:
            requests = self.build_requests(records, step, rank)
            future = self.engine.generate_async(requests, self.sampling)
        expected = self.pushed_version if self.pushed_version is not None else now
        self.pending[step] = PendingGeneration(
            records, requests, future, submitted_at_step=now, expected_version=expected
        )

    def rollout_for_step(self, batch, step: int, rank: int) -> RolloutBatch:
        if not isinstance(batch, PromptWindow):
            raise TypeError(
                "rollout.mode=async needs batches that carry the next steps' prompts: build the "
                "PromptDataModule with lookahead=rollout.max_staleness (build_run does)"
            )
        self.submit(batch.current, step, rank, now=step)  # the first steps, after a resume, or not admitted before
        for offset, records in enumerate(batch.ahead[: self.max_staleness], start=1):
            if self.admits(offset, step):
                self.submit(records, step + offset, rank, now=step)
        pending = self.pending.pop(step)
        wait_start = time.perf_counter()
        with engine_context(step, rank):
            result = pending.future.result()
        wait_seconds = time.perf_counter() - wait_start
        episodes = None
        if self.episodes is not None:
            episodes, generation_seconds = result
            completions = [episode.completion() for episode in episodes]
        else:
            completions = result
            generation_seconds = getattr(pending.future, "timing", {}).get("seconds", wait_seconds)
        reported = [v for c in completions for v in (c.versions() or []) if v >= 0]
        self.engine_delay = max(0, pending.expected_version - min(reported)) if reported else 0
        keep, completions, counts = bound_staleness(
            completions, self.num_generations, self.version_now(step), self.max_off_policy_steps, self.off_policy_action
        )
        records = [pending.records[i // self.num_generations] for i in keep[:: self.num_generations]]
        if episodes is not None:
            episodes = [episodes[i] for i in keep]
            self.episodes.last_episodes = episodes
            rollout = self.episodes.assemble(self, records, episodes, step, generation_seconds, completions)
        else:
            requests = [pending.requests[i] for i in keep]
            rollout = self.assemble(records, requests, completions, step, generation_seconds)
        rollout.timing.update(counts)
        rollout.timing["rollout/wait_seconds"] = wait_seconds
        rollout.timing["rollout/staleness"] = float(step - pending.submitted_at_step)
        return rollout

    def _play_timed(self, records: list[dict], step: int, rank: int) -> tuple[list, float]:
        start = time.perf_counter()
        episodes = self.episodes.play_only(self, records, step, rank, engine=_QueuedEngine(self.engine))
        return episodes, time.perf_counter() - start

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
                "expected_version": p.expected_version,
            }
            for step, p in self.pending.items()
            if self.episodes is None  # episodes in flight are played again after a resume (module doc)
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
                saved["records"], requests, future, saved["submitted_at_step"], saved.get("expected_version", -1)
            )

    def close(self) -> None:
        """Wait for queued generations and drop them (end of training, or an exception)."""
        for pending in self.pending.values():
            pending.future.exception()  # waits; an error here is not this run's to raise
        self.pending.clear()
        if self._players is not None:
            self._players.shutdown(wait=True)
            self._players = None


class _QueuedEngine:
    """The engine as the background episode player sees it: each turn batch queued with ``generate_async``
    (in submission order with the weight syncs), never through ``generate``, which restores the caller's
    torch RNG state: from this thread, that would rewind the training thread's."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, requests: list[GenerationRequest], sampling) -> list[Completion]:
        return self.engine.generate_async(requests, sampling).result()
