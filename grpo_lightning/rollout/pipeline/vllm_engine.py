"""``VLLMPipelineEngine``: one or several vLLM servers as a streaming engine (``rollout.mode=pipeline``).

Requests go token-in/token-out to ``/inference/v1/generate`` (a launched server runs with
``--enable-scale-out``; one started by hand needs it), one per sample with its seed, on threads:
up to ``rollout.vllm.server.concurrency`` a server at once, the rest queued; a group's callback
comes when its last sample returns. Each answer carries the token ids, the log-prob each was
sampled with, and vLLM's ``weight_versions``: spans of output-token indexes and the label the
server's weights had when the step that sampled them ran. Labels change only while generation is
paused, so every token's version is exact, not guessed from timing.

**Weights** (``load_weights``, after each optimizer step): rank 0 pauses every server with its
requests kept (``POST /pause?mode=keep``: the scheduler stops between two steps, sequences stay),
pushes the weights through the server's transport (folder or network, under its watchdog and
retries), resets the prefix cache with ``reset_running_requests`` (vLLM can clear it only so: the
kept sequences are preempted and their keys and values recomputed under the new weights when they
go on, unlike the HF engine's, which keeps the older ones), sets the new version label, and
resumes. Tokens sampled after the resume carry the new version. The other ranks wait until every
server holds the version. The canary (``verify_sync``) runs after the resume (a paused server would
not score it): a wrong sync stops the run at that step, but its version was already set.

The in-process ``LLM`` (and its out-of-process engine) is refused in this mode: its ``generate``
blocks for a whole batch and cannot pause with requests kept. LoRA adapter-only sync is refused too.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from grpo_lightning.records import Completion, PolicyWeights
from grpo_lightning.rollout.engine import EngineError, GenerationRequest, Sampling
from grpo_lightning.rollout.pipeline.engine import EngineClock
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.vllm_generate_route import GENERATE, SCALE_OUT_HINT, parse_choice
from grpo_lightning.rollout.vllm_server import sampling_params
from grpo_lightning.rollout.vllm_server_process import rank


@dataclass
class _Group:
    done: object  # callable(list[Completion])
    failed: object  # callable(BaseException)
    out: list
    left: int
    ids: list[str] = field(default_factory=list)
    over: bool = False  # failed or cancelled: no more callbacks


class VLLMPipelineEngine:
    """A :class:`~grpo_lightning.rollout.pipeline.engine.StreamingEngine` over a
    :class:`~grpo_lightning.rollout.vllm_server.VLLMServerEngine` or a
    :class:`~grpo_lightning.rollout.vllm_server_pool.VLLMServerPool` (see the module docstring); the held-out
    evaluation and the canary go through that engine unchanged."""

    owns_weights = True
    supports_async = True
    streams = True
    verifies_before_commit = False  # the canary runs after the resume (WeightSync calls it)

    def __init__(self, inner):
        if getattr(inner, "takes_adapters", False):
            inner.close()
            raise EngineError(
                "rollout.mode=pipeline with a vLLM server does not sync LoRA adapters alone: set "
                "rollout.vllm.sync.adapter=merged"
            )
        self.inner = inner
        self.members = list(getattr(inner, "members", [inner]))
        self.balance = getattr(inner, "balance", None)
        concurrency = self.members[0].config.server.concurrency * len(self.members)
        self._requests = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="vllm-pipeline-req")
        self._servers = ThreadPoolExecutor(max_workers=len(self.members), thread_name_prefix="vllm-pipeline-sync")
        self._clock = EngineClock()
        self._lock = threading.Lock()
        self._groups: dict[int, _Group] = {}
        self._ids = itertools.count()
        self._outstanding = 0
        self._syncing = False
        self._run = uuid.uuid4().hex[:8]

    # ----------------------------------------------------------------------- the protocol
    def submit(self, requests: list[GenerationRequest], sampling: Sampling, done, failed) -> None:
        key = next(self._ids)
        group = _Group(done, failed, [None] * len(requests), len(requests))
        group.ids = [f"pipeline-{self._run}-{key}-{i}" for i in range(len(requests))]
        with self._lock:
            self._groups[key] = group
            self._outstanding += len(requests)
            self._note()
        for i, request in enumerate(requests):
            self._requests.submit(self._sample, key, i, request, sampling)

    def clock(self):
        return self._clock.read()

    def cancel(self) -> None:
        """Drop every group in flight: their callbacks never come, and the servers abort their requests."""
        with self._lock:
            groups, self._groups = list(self._groups.values()), {}
            for group in groups:
                group.over = True
        ids = [i for g in groups for i in g.ids]
        for member in self.members if ids else []:
            try:
                member.client.call(
                    "POST", "/abort_requests", "the abort of the pipeline's requests", json={"request_ids": ids}
                )
            except VLLMServerError:
                pass  # a server that is gone has nothing left to abort

    def load_weights(self, named_tensors, version: int | None = None) -> float:
        """Pause every server with its requests kept, push, reset the prefix cache, set ``version``, resume."""
        start = time.perf_counter()
        version = (self.inner.weight_version or 0) + 1 if version is None else version
        weights = PolicyWeights(list(named_tensors), version)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()
        with self._lock:
            self._syncing = True
            self._note()
        try:
            if rank() == 0:
                self._push_paused(weights)
            else:
                self._on_every_server(lambda m: m._wait_for_version(version))
        finally:
            with self._lock:
                self._syncing = False
                self._note()
        for m in {id(x): x for x in [*self.members, self.inner]}.values():
            m.weight_version = version
        return time.perf_counter() - start

    def _push_paused(self, weights: PolicyWeights) -> None:
        paused = []
        try:
            self._on_every_server(lambda m: m.client.call("POST", "/pause?mode=keep", "the pause before a weight sync"))
            paused = self.members
            self._on_every_server(lambda m: m._push_with_retries(weights, None, commit=False))
            self._on_every_server(self._reset_cache)
            self._on_every_server(lambda m: m.commit(weights.version))
        finally:
            if paused:
                self._on_every_server(lambda m: m.client.call("POST", "/resume", "the resume after a weight sync"))

    @staticmethod
    def _reset_cache(member) -> None:
        answer = member.client.call(
            "POST", "/reset_prefix_cache?reset_running_requests=true", "the prefix-cache reset (requests kept)"
        )
        if isinstance(answer, dict) and answer.get("success") is False:
            raise VLLMServerError(
                f"the vLLM server {member.client.url} could not reset its prefix cache after the weight sync: "
                f"requests admitted next would reuse prompt keys and values of the older weights"
            )

    def _on_every_server(self, step) -> None:
        futures = [self._servers.submit(step, m) for m in self.members]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]

    # ----------------------------------------------------------------------- the requests
    def _sample(self, key: int, index: int, request: GenerationRequest, sampling: Sampling) -> None:
        with self._lock:
            group = self._groups.get(key)
        if group is None or group.over:
            self._release(1)
            return
        try:
            completion = self._generate(request, sampling, group.ids[index])
        except BaseException as err:  # noqa: BLE001  (the group's owner hears of it)
            self._release(1)
            with self._lock:
                fail = not group.over
                group.over = True
                self._groups.pop(key, None)
            if fail:
                group.failed(err if isinstance(err, EngineError | VLLMServerError) else EngineError(str(err)))
            return
        self._release(1)
        with self._lock:
            if group.over:
                return
            group.out[index] = completion
            group.left -= 1
            finished = group.left == 0
            if finished:
                self._groups.pop(key, None)
        if finished:
            group.done(group.out)

    def _generate(self, request: GenerationRequest, sampling: Sampling, request_id: str) -> Completion:
        if request.vision is not None:
            raise EngineError("rollout.mode=pipeline with a vLLM server decodes text prompts only")
        cost = len(request.prompt_ids) + sampling.max_new_tokens
        i = self.balance.acquire(cost) if self.balance is not None else 0
        member = self.members[i]
        try:
            body = {
                "request_id": request_id,
                "model": member.client.model,
                "token_ids": list(request.prompt_ids),
                "sampling_params": sampling_params(sampling, request.seed),
            }
            answer = member.client.call("POST", GENERATE, "a generation request", hint=SCALE_OUT_HINT, json=body)
        finally:
            if self.balance is not None:
                self.balance.release(i, cost)
        return parse_choice(answer["choices"][0])

    def _release(self, n: int) -> None:
        with self._lock:
            self._outstanding -= n
            self._note()

    def _note(self) -> None:
        """The clock's state (under the lock): sync while taking weights, else busy with requests out."""
        self._clock.switch("sync" if self._syncing else "busy" if self._outstanding > 0 else "idle")

    # ----------------------------------------------------------------------- the rest: the wrapped engine
    def generate(self, requests, sampling):
        return self.inner.generate(requests, sampling)

    def generate_async(self, requests, sampling):
        return self.inner.generate_async(requests, sampling)

    def sequence_logprobs(self, prompt_ids, completion_ids):
        return self.inner.sequence_logprobs(prompt_ids, completion_ids)

    @property
    def weight_version(self):
        return self.inner.weight_version

    @property
    def transport(self):
        return self.inner.transport

    def __getattr__(self, name):  # start_seconds, eos_token_id, client, ...: the wrapped engine's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def close(self) -> None:
        self.cancel()
        self._requests.shutdown(wait=False, cancel_futures=True)
        self._servers.shutdown(wait=False, cancel_futures=True)
        self.inner.close()
