"""The ``network`` transport against a real vLLM server (the session's shared one): the weights
travel over a gloo group to the server's worker extension in buckets, never through a folder; the
canary then matches and the server reports the new version."""

from __future__ import annotations

import os

import torch
from test_vllm_server import perturbed_policy

from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.rollout import WeightSync
from grpo_lightning.rollout.transports import NetworkTransport
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights, probe_scores


def test_network_sync_needs_no_folder_the_server_can_read(vllm_server):
    tok = build_char_tokenizer()
    module = GRPOModule(perturbed_policy(tok, seed=11), AlgorithmConfig(beta=0.0))
    shared = os.path.join(vllm_server.sync_folder(), "model.safetensors")
    stamp = os.stat(shared).st_mtime_ns if os.path.exists(shared) else None
    folder_transport, vllm_server.transport = vllm_server.transport, NetworkTransport(timeout_s=60.0, bucket_mb=0.1)
    try:
        sync = WeightSync(verify=True, tolerance=1e-4)
        for version in (11, 12):  # the second push reuses the group
            with torch.no_grad():
                next(module.policy.parameters()).add_(0.01)
            weights = policy_weights(module.policy, version)
            metrics = sync.sync(weights, vllm_server, probe_scores(module, tokenizer=tok))
            assert metrics["rollout/sync_probe_diff"] <= 1e-4
            sent = sum(t.numel() * t.element_size() for _, t in policy_weights(module.policy, version).tensors)
            assert metrics["rollout/sync_bytes"] == sent
            assert vllm_server.client.call("GET", "/weight_info", "test")["weight_version"] == str(version)
    finally:
        vllm_server.transport.close()
        vllm_server.transport = folder_transport
    assert (os.stat(shared).st_mtime_ns if os.path.exists(shared) else None) == stamp  # no folder was written
