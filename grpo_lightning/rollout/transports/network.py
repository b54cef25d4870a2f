"""``network``: weights travel to a vLLM server over a process group, no shared file system needed.

Rank 0 hosts a TCPStore on ``rollout.vllm.sync.host:port``; the server's worker (the
:class:`~grpo_lightning.rollout.transports.network_receiver.NetworkWeightReceiver` extension, which a
launched server loads) joins it over HTTP and the two form a group of their own: gloo on CPU, NCCL
on GPU. Each push sends the plan over HTTP and the bytes in buckets of ``bucket_mb``, one broadcast
each, every one bounded by ``timeout_s``; the engine's watchdog bounds the whole push and calls
:meth:`abort` past it. A failed push drops the group; the next push opens a fresh one (a retry).
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist

from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.transport import TRANSPORTS
from grpo_lightning.rollout.transports.wire import broadcast, open_group, pack, plan_buckets

RECEIVER = "grpo_lightning.rollout.transports.network_receiver.NetworkWeightReceiver"  # --worker-extension-cls


@TRANSPORTS.register("network")
class NetworkTransport:
    """Pushes through ``engine.worker_call`` (HTTP to the server's workers) plus the weight group."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 120.0, bucket_mb: float = 64.0):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.bucket_bytes = max(int(bucket_mb * 2**20), 1)
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.device = torch.device("cuda") if self.backend == "nccl" else torch.device("cpu")
        self._store = self._group = None
        self._http = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-network-sync")
        self.last_bytes = 0

    @classmethod
    def from_config(cls, sync) -> NetworkTransport:
        """From ``rollout.vllm.sync``."""
        return cls(sync.host, sync.port, sync.timeout_s, sync.bucket_mb)

    def push(self, weights: PolicyWeights, engine) -> dict:
        """Send ``weights`` and have the server reload them (a LoRA adapter: save it on its own disk);
        returns the server's answer (tensors and bytes received; an adapter's path on the server)."""
        try:
            if self._group is None:
                self._open(engine)
            plan, tensors = plan_buckets(list(weights.tensors), self.bucket_bytes)
            spec = {"plan": plan, "adapter_config": weights.adapter_config}
            answer = self._http.submit(engine.worker_call, "grpo_receive_weights", "the network weight update", spec)
            deadline = time.monotonic() + self.timeout_s
            for bucket in tensors:
                if answer.done():  # the server gave up (or failed) before taking every bucket
                    answer.result()
                broadcast(self._group, pack(bucket, self.device), max(deadline - time.monotonic(), 0.001))
            result = answer.result(timeout=max(deadline - time.monotonic(), 0.001))[0]
        except BaseException:
            self.abort()
            raise
        self.last_bytes = int(result["bytes"])
        return result

    def push_adapter(self, weights: PolicyWeights, engine) -> str:
        """Ship a LoRA adapter's tensors; returns where the server saved it (for ``load_lora_adapter``)."""
        return self.push(weights, engine)["path"]

    def remove_adapter(self, path: str, engine) -> None:
        engine.worker_call("grpo_remove_adapter", "removing an unloaded adapter", {"path": path})

    def _open(self, engine) -> None:
        timeout = timedelta(seconds=self.timeout_s)
        self._store = dist.TCPStore(self.host, self.port, 2, True, timeout=timeout, wait_for_workers=False)
        tag = secrets.token_hex(8)  # a fresh key space for every group on this store
        spec = {"backend": self.backend, "host": self.host, "port": self._store.port, "timeout_s": self.timeout_s}
        joined = self._http.submit(
            engine.worker_call, "grpo_open_weight_group", "joining the weight group", spec | {"tag": tag}
        )
        self._group = open_group(self.backend, self.host, self._store.port, 0, self.timeout_s, tag, store=self._store)
        joined.result(timeout=self.timeout_s)

    def abort(self) -> None:
        """Drop the group (NCCL: abort its communicator, unblocking a stuck collective); the next push reopens."""
        group, self._group, self._store = self._group, None, None
        if group is not None:
            try:
                group.abort()
            except RuntimeError:
                pass

    def close(self) -> None:
        self.abort()
        self._http.shutdown(wait=False, cancel_futures=True)
