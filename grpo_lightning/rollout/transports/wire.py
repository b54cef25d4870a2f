"""Both ends of the ``network`` transport: the two-member process group and the bucket format.

The trainer (rank 0) and the vLLM worker (rank 1) meet on a TCPStore the trainer hosts and form a
process group of their own (gloo on CPU, NCCL on GPU), apart from any training or vLLM group. A
weight update is a plan (each bucket's names, dtypes and shapes, sent as JSON over HTTP) and one
broadcast per bucket of the bucket's bytes; every collective waits at most ``timeout_s``.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

TensorMeta = tuple[str, str, list[int]]  # name, dtype (e.g. "float32"), shape


def open_group(backend: str, host: str, port: int, rank: int, timeout_s: float, tag: str, store=None):
    """Join (or, as rank 0 with ``store`` given, host) the two-member group; returns it."""
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, 2, False, timeout=timeout)
    prefixed = dist.PrefixStore(tag, store)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        # The trainer binds its address; the server its default interface (GLOO_SOCKET_IFNAME picks another).
        if rank == 0 or _loopback(host):
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        else:
            options._devices = [dist.ProcessGroupGloo.create_default_device()]
        return dist.ProcessGroupGloo(prefixed, rank, 2, options)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(prefixed, rank, 2, options)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def plan_buckets(named_tensors, bucket_bytes: int) -> tuple[list[list[TensorMeta]], list[list[torch.Tensor]]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (a larger tensor is one bucket)."""
    plan: list[list[TensorMeta]] = []
    tensors: list[list[torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if not plan or (size + nbytes > bucket_bytes and plan[-1]):
            plan.append([])
            tensors.append([])
            size = 0
        plan[-1].append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)))
        tensors[-1].append(tensor)
        size += nbytes
    return plan, tensors


def pack(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One flat byte tensor holding ``tensors`` back to back."""
    return torch.cat([t.detach().to(device).contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def bucket_bytes(bucket: list[TensorMeta]) -> list[int]:
    """The byte size of each tensor of a planned bucket."""
    sizes = []
    for _, dtype, shape in bucket:
        numel = 1
        for n in shape:
            numel *= n
        sizes.append(numel * torch.empty((), dtype=getattr(torch, dtype)).element_size())
    return sizes


def unpack(flat: torch.Tensor, bucket: list[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of a received bucket (copies: a view would need each offset aligned to its dtype)."""
    out, offset = [], 0
    for (name, dtype, shape), size in zip(bucket, bucket_bytes(bucket), strict=True):
        out.append((name, flat[offset : offset + size].clone().view(getattr(torch, dtype)).reshape(shape)))
        offset += size
    return out


def broadcast(group, flat: torch.Tensor, timeout_s: float) -> None:
    """Rank 0 sends ``flat``, rank 1 receives into it; at most ``timeout_s`` (gloo honours it; the
    caller's watchdog covers NCCL, which may not)."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([flat], options).wait(timedelta(seconds=timeout_s))
