"""Two real vLLM servers behind one engine (rollout/vllm_server_pool.py): the session's shared
server and one more launched here. Weights travel over the network to each, the canary is scored
on each, both report the version, generations use both; in pipeline mode a sync pauses both with
their requests kept and resumes both; a server killed before a sync is named and the other's
version does not move."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest
import torch
from test_vllm_server import perturbed_policy, requests

from grpo_lightning.config import AlgorithmConfig, RolloutConfig, VLLMConfig, VLLMServerConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout import Sampling, WeightSync
from grpo_lightning.rollout.pipeline.vllm_engine import VLLMPipelineEngine
from grpo_lightning.rollout.transports import NetworkTransport
from grpo_lightning.rollout.vllm_server import VLLMServerEngine, VLLMServerError
from grpo_lightning.rollout.vllm_server_pool import VLLMServerPool
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights, probe_scores


def _version(engine) -> str:
    return engine.client.call("GET", "/weight_info", "test")["weight_version"]


@pytest.mark.slow
def test_two_servers_get_every_sync_and_share_the_requests(vllm_server):
    tok = build_char_tokenizer()
    settings = VLLMConfig(max_model_len=128, kv_cache_gib=0.5, server=VLLMServerConfig(launch=True, timeout_s=60))
    second = VLLMServerEngine.from_policy(build_tiny_policy(tok), tok, settings, seed=0)
    pool = VLLMServerPool([vllm_server, second], concurrency=4)
    folder_transport = vllm_server.transport
    for member in pool.members:
        member.transport = NetworkTransport(timeout_s=60.0, bucket_mb=0.1)
    try:
        module = GRPOModule(perturbed_policy(tok, seed=21), AlgorithmConfig(beta=0.0))
        scored = []
        for member in pool.members:
            member.sequence_logprobs = lambda *a, _m=member, _f=member.sequence_logprobs: scored.append(_m) or _f(*a)
        metrics = WeightSync(verify=True, tolerance=1e-4).sync(
            policy_weights(module.policy, 31), pool, probe_scores(module, tokenizer=tok)
        )
        assert metrics["rollout/sync_probe_diff"] <= 1e-4 and {id(m) for m in scored} == {id(vllm_server), id(second)}
        sent = sum(t.numel() * t.element_size() for _, t in policy_weights(module.policy, 31).tensors)
        assert metrics["rollout/sync_bytes"] == 2 * sent  # the whole model to each server
        assert [_version(m) for m in pool.members] == ["31", "31"]
        completions = pool.generate(requests(tok, 0), Sampling.from_config(RolloutConfig(max_new_tokens=6)))
        assert len(completions) == 16 and {c.weight_version for c in completions} == {31}
        assert min(pool.balance.sent) >= 1

        # rollout.mode=pipeline over both: a sync with requests kept (paused, pushed, resumed on each)
        streaming, sent = VLLMPipelineEngine(pool), list(pool.balance.sent)
        done: Future = Future()
        long = Sampling.from_config(RolloutConfig(max_new_tokens=100))
        streaming.submit(requests(tok, 0), long, done.set_result, done.set_exception)
        time.sleep(0.3)  # requests in flight on both servers
        with torch.no_grad():
            next(module.policy.parameters()).add_(0.01)
        streaming.load_weights(policy_weights(module.policy, 32).tensors, version=32)
        kept = done.result(timeout=120)
        assert len(kept) == 16 and all(c.token_weight_versions in (None, sorted(c.token_weight_versions)) for c in kept)
        assert {v for c in kept for v in c.versions() or []} <= {31, 32}
        assert [_version(m) for m in pool.members] == ["32", "32"] and pool.weight_version == 32
        assert all(now > before for now, before in zip(pool.balance.sent, sent, strict=True))
        assert not any(m.client.call("GET", "/is_paused", "test")["is_paused"] for m in pool.members)

        # The dead server's retry can only time out: a short timeout keeps the test short.
        second.transport.close()
        second.transport = NetworkTransport(timeout_s=5.0, bucket_mb=0.1)
        second.server.process.kill()  # a server gone before the next sync
        second.server.process.wait(30)
        with torch.no_grad():
            next(module.policy.parameters()).add_(0.01)
        with pytest.raises(VLLMServerError) as caught:
            pool.load_weights(policy_weights(module.policy, 33).tensors, version=33)
        assert second.client.url in str(caught.value) and "failed on 1 of 2 vLLM servers" in str(caught.value)
        assert _version(vllm_server) == "32" and pool.weight_version == 32
    finally:
        for member in pool.members:
            member.transport.close()
            member.__dict__.pop("sequence_logprobs", None)
        vllm_server.transport = folder_transport
        pool.members = [second]  # the session's server stays up for the other tests
        pool.close()
