"""Several vLLM servers behind one run: data-parallel rollouts.

One server bounds a run's generation throughput; ``rollout.vllm.server.urls=[...]`` (running
servers) or ``rollout.vllm.server.replicas=N`` (launched ones) put several behind it. Each server
gets a :class:`~grpo_lightning.rollout.vllm_server.VLLMServerEngine` of its own (its client, its
transport, its launched process), and :class:`VLLMServerPool` is the one engine the run sees:

- **Requests** go one by one to the server with the fewest outstanding tokens (prompt plus
  completion budget) of this rank, then the fewest outstanding requests, then the fewest sent
  (:class:`LeastLoaded`): a slow or busy server gets fewer. Seeds travel with the requests, so
  which server samples a request does not change the completion.
- **Weight sync** goes to every server, in parallel: each push runs under its own watchdog and
  retries, then the canary on that server; only when every server passed does any server's
  version move (then each is bumped), and only then the version completions are stamped with. A
  server that fails is named in a one-line :class:`VLLMServerError` (or the canary's
  :class:`WeightSyncError`); no server reports the new version.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

import grpo_lightning.rollout.server_guard as server_guard
from grpo_lightning.config import VLLMConfig
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.engine import Completion, GenerationRequest, Sampling
from grpo_lightning.rollout.lora_adapters import LoraServing
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.vllm_server import QueuedGeneration, VLLMServerEngine
from grpo_lightning.rollout.vllm_server_process import base_url, launch_shared, rank
from grpo_lightning.rollout.vllm_vision import EngineVision
from grpo_lightning.rollout.weight_sync import WeightSyncError

_Sent = namedtuple("_Sent", "last_bytes")  # what WeightSync reads of engine.transport


class LeastLoaded:
    """Hands out server indices by load and counts what each has outstanding; thread-safe."""

    def __init__(self, n: int):
        self.tokens, self.requests, self.sent = [0] * n, [0] * n, [0] * n
        self._lock = threading.Lock()

    def acquire(self, cost: int) -> int:
        """The least loaded server (ties: fewest sent, then lowest index), now ``cost`` tokens busier."""
        with self._lock:
            i = min(range(len(self.tokens)), key=lambda k: (self.tokens[k], self.requests[k], self.sent[k], k))
            self.tokens[i] += cost
            self.requests[i] += 1
            self.sent[i] += 1
            return i

    def release(self, i: int, cost: int) -> None:
        with self._lock:
            self.tokens[i] -= cost
            self.requests[i] -= 1


def member_config(config: VLLMConfig, i: int, n: int) -> VLLMConfig:
    """Server ``i``'s settings: a weight-group port of its own (``port + i``) and its own sync folder."""
    sync, server = config.sync, config.server
    if n > 1 and sync.port:
        sync = dataclasses.replace(sync, port=sync.port + i)
    if n > 1 and server.sync_dir:
        server = dataclasses.replace(server, sync_dir=os.path.join(server.sync_dir, f"server-{i}"))
    return dataclasses.replace(config, sync=sync, server=server)


class VLLMServerPool(QueuedGeneration):
    """A :class:`RolloutEngine` over several vLLM servers (see the module docstring)."""

    owns_weights = True
    supports_async = True

    def __init__(self, members: list[VLLMServerEngine], concurrency: int):
        if not members:
            raise ValueError("a server pool needs at least one server")
        self.members = list(members)
        self.balance = LeastLoaded(len(members))
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-pool")
        self._requests = ThreadPoolExecutor(max_workers=concurrency * len(members), thread_name_prefix="vllm-pool-req")
        self._pushes = ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="vllm-pool-push")
        self.weight_version: int | None = None
        self.takes_adapters = members[0].takes_adapters
        self.eos_token_id = members[0].eos_token_id
        self.start_seconds = max(m.start_seconds for m in members)

    @classmethod
    def from_policy(
        cls, policy, tokenizer, config: VLLMConfig, seed: int, lora: LoraServing | None = None
    ) -> VLLMServerPool:
        """Connect to every ``config.server.urls``, or launch ``replicas`` servers (rank 0; they start
        side by side) and connect to each."""
        s = config.server
        if s.launch:
            launched = []
            try:
                for _ in range(s.replicas):
                    launched.append(launch_shared(policy, tokenizer, config, seed, lora))
            except BaseException:
                for server, _, _ in launched:
                    if server is not None:
                        server.stop()
                raise
            targets = [(base_url(s, port), server, token) for server, port, token in launched]
        else:
            token = server_guard.api_key_from_env(s.api_key_env)
            targets = [(url.rstrip("/"), None, token) for url in s.urls]
        members: list[VLLMServerEngine] = []
        vision = EngineVision.of(policy)
        try:
            for i, (url, server, token) in enumerate(targets):
                member = member_config(config, i, len(targets))
                members.append(
                    VLLMServerEngine.connect(member, url, tokenizer.eos_token_id, server, token, lora, vision)
                )
        except BaseException:
            for m in members:
                m.close()
            for _, server, _ in targets[len(members) + 1 :]:
                if server is not None:
                    server.stop()
            raise
        return cls(members, s.concurrency)

    @property
    def transport(self) -> _Sent:
        """The bytes the last sync sent, over all servers."""
        return _Sent(sum(getattr(m.transport, "last_bytes", 0) or 0 for m in self.members))

    # ------------------------------------------------------------------ generation
    def _one(self, request: GenerationRequest, sampling: Sampling) -> Completion:
        cost = len(request.prompt_ids) + sampling.max_new_tokens
        i = self.balance.acquire(cost)  # chosen when a slot frees, not when queued: load at send time
        try:
            return self.members[i]._one(request, sampling)
        finally:
            self.balance.release(i, cost)

    def sequence_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        cost = len(prompt_ids) + len(completion_ids)
        i = self.balance.acquire(cost)
        try:
            return self.members[i].sequence_logprobs(prompt_ids, completion_ids)
        finally:
            self.balance.release(i, cost)

    # ------------------------------------------------------------------ weights
    def _synced(self, weights: PolicyWeights, check) -> None:
        """Rank 0 pushes to every server at once (each checked by ``check(server)``) and bumps their
        versions only once all passed; the other ranks wait until every server holds the version."""
        version, pushing = weights.version, rank() == 0
        kept = "; no server reports the new version" if pushing else ""
        self._on_every_server(lambda m: m.after_barrier(weights, check, commit=False), version, kept)
        if pushing:
            self._on_every_server(lambda m: m.commit(version), version)
        for m in self.members:
            m.weight_version = version

    def _on_every_server(self, step, version: int, kept: str = "") -> None:
        """``step(server)`` on every server at once; any failure raises naming the servers it failed on."""
        futures = [(m, self._pushes.submit(step, m)) for m in self.members]
        failed = [(m, f.exception()) for m, f in futures if f.exception() is not None]
        if not failed:
            return
        n, (first, err) = len(self.members), failed[0]
        where = ", ".join(m.client.url for m, _ in failed)
        message = (
            f"the weight sync to version {version} failed on {len(failed)} of {n} vLLM servers ({where}){kept}. "
            f"{first.client.url}: {err}"
        )
        raise (WeightSyncError if isinstance(err, WeightSyncError) else VLLMServerError)(message) from err

    def close(self) -> None:
        """Stop the threads and every server's engine (and a server it launched)."""
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._requests.shutdown(wait=False, cancel_futures=True)
        self._pushes.shutdown(wait=False, cancel_futures=True)
        for m in self.members:
            m.close()
