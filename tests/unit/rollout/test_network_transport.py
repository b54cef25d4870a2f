"""The ``network`` transport end to end in one process: the trainer side pushes over a real gloo
group to a :class:`NetworkWeightReceiver` standing in for vLLM's worker (its ``worker_call`` runs
the receiver's method as the server's ``/collective_rpc`` would). No file system is involved:
the receiver gets tensors, never a path."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from grpo_lightning.config import VLLMSyncConfig
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.transports import TRANSPORTS, NetworkTransport, make_transport
from grpo_lightning.rollout.transports.network_receiver import NetworkWeightReceiver
from grpo_lightning.rollout.transports.wire import pack, plan_buckets, unpack


class FakeWorker(NetworkWeightReceiver):
    """vLLM's worker as far as the receiver uses it: ``reload_weights(weights_iterator=...)``."""

    def __init__(self, fail_reload: bool = False):
        self.reloads: list[dict[str, torch.Tensor]] = []
        self.fail_reload = fail_reload

    def reload_weights(self, weights_iterator):
        if self.fail_reload:
            raise RuntimeError("no such parameter: model.bogus")
        self.reloads.append({name: t.clone() for name, t in weights_iterator})


class FakeServer:
    """What the transport needs of the engine: ``worker_call`` (``/collective_rpc`` with a JSON string)."""

    def __init__(self, worker: FakeWorker):
        self.worker, self.calls = worker, []

    def worker_call(self, method: str, what: str, spec: dict) -> list:
        self.calls.append(method)
        return [getattr(self.worker, method)(json.dumps(spec))]


def _weights(version: int = 1) -> PolicyWeights:
    g = torch.Generator().manual_seed(version)
    return PolicyWeights(
        [
            ("embed.weight", torch.randn(50, 32, generator=g)),
            ("layer.weight", torch.randn(32, 32, generator=g).to(torch.bfloat16)),
            ("norm.weight", torch.ones(32)),
            ("steps", torch.tensor([version], dtype=torch.int64)),
        ],
        version,
    )


def test_network_is_registered_and_built_from_the_sync_config():
    assert "network" in TRANSPORTS
    transport = make_transport("network", VLLMSyncConfig(transport="network", timeout_s=7.0, bucket_mb=0.5))
    assert isinstance(transport, NetworkTransport)
    assert transport.timeout_s == 7.0 and transport.bucket_bytes == 2**19 and transport.backend == "gloo"
    transport.close()


def test_weights_arrive_bit_for_bit_in_buckets_and_a_second_push_reuses_the_group():
    worker = FakeWorker()
    server, transport = FakeServer(worker), NetworkTransport(timeout_s=20.0, bucket_mb=0.004)  # ~4 KiB buckets
    try:
        for version in (1, 2):
            pushed = _weights(version)
            answer = transport.push(pushed, server)
            got = worker.reloads[-1]
            assert list(got) == [name for name, _ in pushed.tensors]
            for name, tensor in pushed.tensors:
                assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor)
            assert answer["bytes"] == sum(t.numel() * t.element_size() for _, t in pushed.tensors)
            assert transport.last_bytes == answer["bytes"]
        assert server.calls == ["grpo_open_weight_group", "grpo_receive_weights", "grpo_receive_weights"]
    finally:
        transport.close()


def test_a_failed_load_on_the_server_raises_and_drops_the_group_for_a_fresh_retry():
    worker = FakeWorker(fail_reload=True)
    server, transport = FakeServer(worker), NetworkTransport(timeout_s=20.0)
    try:
        with pytest.raises(RuntimeError, match="model.bogus"):
            transport.push(_weights(), server)
        assert transport._group is None  # the next push opens a new group
        worker.fail_reload = False
        transport.push(_weights(2), server)
        assert server.calls.count("grpo_open_weight_group") == 2 and len(worker.reloads) == 1
    finally:
        transport.close()


def test_an_adapter_push_lands_in_a_folder_of_the_servers_own(tmp_path):
    worker = FakeWorker()
    server, transport = FakeServer(worker), NetworkTransport(timeout_s=20.0)
    adapter = PolicyWeights([("base_model.model.q.lora_A.weight", torch.randn(4, 32))], 3, adapter_config={"r": 4})
    try:
        answer = transport.push(adapter, server)
    finally:
        transport.close()
    saved = load_file(f"{answer['path']}/adapter_model.safetensors")
    assert torch.equal(saved["base_model.model.q.lora_A.weight"], adapter.tensors[0][1])
    assert json.load(open(f"{answer['path']}/adapter_config.json")) == {"r": 4}
    assert not worker.reloads  # an adapter is not loaded as base weights


def test_bucket_plans_keep_order_respect_the_bound_and_round_trip():
    draw = random.Random(0)
    for case in range(200):
        tensors = [
            (
                f"t{i}",
                torch.randn(draw.randint(0, 40), dtype=torch.float32).to(draw.choice([torch.float32, torch.bfloat16])),
            )
            for i in range(draw.randint(1, 12))
        ]
        bound = draw.randint(1, 200)
        plan, buckets = plan_buckets(tensors, bound)
        assert [meta[0] for bucket in plan for meta in bucket] == [name for name, _ in tensors]
        for bucket in buckets:
            sizes = [t.numel() * t.element_size() for t in bucket]
            assert len(bucket) >= 1 and (sum(sizes) <= bound or len(bucket) == 1), (case, sizes, bound)
        round_trip = [
            pair for meta, bucket in zip(plan, buckets, strict=True) for pair in unpack(pack(bucket, "cpu"), meta)
        ]
        for (name, want), (got_name, got) in zip(tensors, round_trip, strict=True):
            assert name == got_name and got.dtype == want.dtype and torch.equal(got, want)
