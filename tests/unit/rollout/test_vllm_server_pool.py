"""Several vLLM servers behind one run (rollout/vllm_server_pool.py), against stand-in servers
(tests/helpers/fake_vllm_server.py): weights reach every server and no server's version moves
unless all passed, a failed server is named, requests go to the least loaded server."""

from __future__ import annotations

import random
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
from helpers.fake_server_engine import FakeServers, held

from grpo_lightning.config import TrainConfig, VLLMConfig, VLLMServerConfig, VLLMSyncConfig
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.engine import GenerationRequest, Sampling
from grpo_lightning.rollout.vllm import vllm_engine
from grpo_lightning.rollout.vllm_server import VLLMServerError
from grpo_lightning.rollout.vllm_server_pool import LeastLoaded, VLLMServerPool, member_config
from grpo_lightning.rollout.weight_sync import ProbeScores, WeightSync, WeightSyncError

SAMPLING = Sampling(max_new_tokens=3, temperature=1.0, top_p=1.0, top_k=0)


@pytest.fixture
def pool(tmp_path):
    """``pool(reload_a, reload_b, **sync)``: two fake servers (their reloads behave as told) in one pool."""
    servers, made = FakeServers(tmp_path), []

    def start(*reloads: str, **sync):
        made.append(VLLMServerPool([servers.start(r, timeout_s=5.0, **sync)[0] for r in reloads], concurrency=4))
        return made[-1]

    yield start
    for p in made:
        p._requests.shutdown(wait=True)
    servers.close()


def _weights(version: int = 5) -> PolicyWeights:
    return PolicyWeights([("w", torch.ones(3))], version)


def _requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest(prompt_ids=[5 + i % 7, 9, 11 + i % 3], seed=1000 + i) for i in range(n)]


def test_least_loaded_always_picks_a_server_with_the_fewest_outstanding_tokens():
    draw = random.Random(0)
    for _ in range(200):
        n = draw.randint(1, 5)
        balance, held_now = LeastLoaded(n), []
        for _ in range(draw.randint(1, 40)):
            if held_now and draw.random() < 0.4:
                balance.release(*held_now.pop(draw.randrange(len(held_now))))
                continue
            before, cost = list(balance.tokens), draw.randint(1, 50)
            i = balance.acquire(cost)
            assert before[i] == min(before) and balance.tokens[i] == before[i] + cost
            held_now.append((i, cost))
        for i, cost in held_now:
            balance.release(i, cost)
        assert balance.tokens == [0] * n and balance.requests == [0] * n


def test_idle_servers_take_requests_in_turn():
    balance = LeastLoaded(3)
    picks = []
    for _ in range(6):
        picks.append(balance.acquire(10))
        balance.release(picks[-1], 10)
    assert picks == [0, 1, 2, 0, 1, 2]


def test_a_sync_reaches_every_server_and_the_version_moves_on_all(pool):
    engine = pool("ok", "ok")
    engine.load_weights(_weights().tensors, version=5)
    assert [held(m)["weight_version"] for m in engine.members] == ["5", "5"]
    assert [held(m)["reloads"] for m in engine.members] == [1, 1] and engine.weight_version == 5


def test_a_failed_server_is_named_and_no_server_reports_the_new_version(pool):
    engine = pool("ok", "fail", retries=0)
    good, bad = engine.members
    with pytest.raises(VLLMServerError) as caught:
        engine.load_weights(_weights().tensors, version=5)
    message = str(caught.value)
    assert "failed on 1 of 2 vLLM servers" in message and bad.client.url in message and good.client.url not in message
    assert "\n" not in message and held(good)["reloads"] == 1  # the good one took the weights ...
    assert [held(m)["weight_version"] for m in engine.members] == ["0", "0"]  # ... but no version moved
    assert engine.weight_version is None


def test_a_failed_push_to_one_server_is_retried_and_then_every_server_commits(pool):
    engine = pool("ok", "fail_once", retries=1)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        engine.load_weights(_weights().tensors, version=7)
    assert [held(m)["weight_version"] for m in engine.members] == ["7", "7"]
    assert [held(m)["reloads"] for m in engine.members] == [1, 2]


def test_the_canary_is_scored_on_every_server_before_any_version_moves(pool, monkeypatch):
    engine = pool("ok", "ok")
    scored = []
    for m in engine.members:
        original = m.sequence_logprobs
        monkeypatch.setattr(m, "sequence_logprobs", lambda *a, _m=m, _f=original: scored.append(_m) or _f(*a))
    prompt, completion = WeightSync.probe_ids()
    sync = WeightSync(verify=True, tolerance=1e-3)
    with pytest.raises(WeightSyncError, match="canary"):  # the fakes score every token -1.0
        sync.sync(_weights(), engine, ProbeScores(prompt, completion, torch.full((len(completion),), -2.0)))
    assert [held(m)["weight_version"] for m in engine.members] == ["0", "0"]
    scored.clear()
    metrics = sync.sync(_weights(6), engine, ProbeScores(prompt, completion, torch.full((len(completion),), -1.0)))
    assert sorted(id(m) for m in scored) == sorted(id(m) for m in engine.members)
    assert metrics["rollout/sync_probe_diff"] == 0.0
    assert [held(m)["weight_version"] for m in engine.members] == ["6", "6"]


def test_requests_are_spread_and_completions_do_not_depend_on_the_server(pool):
    engine = pool("ok", "ok")
    engine.load_weights(_weights().tensors, version=3)
    completions = engine.generate(_requests(40), SAMPLING)
    alone = engine.members[0].generate(_requests(40), SAMPLING)  # one server: the same seeds, the same samples
    assert [c.token_ids for c in completions] == [c.token_ids for c in alone]
    assert all(c.weight_version == 3 for c in completions)
    assert min(engine.balance.sent) >= 1 and sum(engine.balance.sent) == 40  # how evenly: timing (next test)


def test_a_slow_server_gets_fewer_requests(pool, monkeypatch):
    engine = pool("ok", "ok")
    slow = engine.members[1]
    original = slow._one
    monkeypatch.setattr(slow, "_one", lambda *a: time.sleep(0.2) or original(*a))
    engine.generate(_requests(48), SAMPLING)
    assert engine.balance.sent[1] * 2 < engine.balance.sent[0]
    assert engine.balance.tokens == [0, 0]


def test_server_urls_settings_are_validated():
    def problems(**server) -> str:
        return " ".join(VLLMConfig(server=VLLMServerConfig(**server)).validate("rollout.vllm."))

    assert problems(urls=["http://a:1", "http://b:1"]) == ""
    assert "urls=[...] excludes" in problems(urls=["http://a:1"], url="http://b:1")
    assert "urls=[...] excludes" in problems(urls=["http://a:1"], launch=True)
    assert "must start with http://" in problems(urls=["a:1"])
    assert "names a server twice" in problems(urls=["http://a:1", "http://a:1"])
    assert "replicas=2 needs" in problems(replicas=2)
    assert "replicas=2 needs" in problems(replicas=2, launch=True, port=8000)
    assert problems(replicas=2, launch=True) == ""
    assert "replicas=0 must be >= 1" in problems(replicas=0)


def test_each_server_gets_its_own_weight_group_port_and_sync_folder():
    config = VLLMConfig(server=VLLMServerConfig(sync_dir="/shared/sync"), sync=VLLMSyncConfig(port=29600))
    members = [member_config(config, i, 2) for i in range(2)]
    assert [m.sync.port for m in members] == [29600, 29601]
    assert [m.server.sync_dir for m in members] == ["/shared/sync/server-0", "/shared/sync/server-1"]
    assert member_config(config, 0, 1) == config and config.sync.port == 29600


def test_urls_make_the_vllm_engine_a_pool_of_those_servers(tmp_path):
    servers = FakeServers(tmp_path)
    try:
        urls = [servers.start()[0].client.url for _ in range(2)]
        cfg = TrainConfig()
        cfg.rollout.engine = "vllm"
        cfg.rollout.vllm.server.urls = urls
        engine = vllm_engine(None, SimpleNamespace(eos_token_id=0), cfg)
        assert isinstance(engine, VLLMServerPool) and [m.client.url for m in engine.members] == urls
        assert cfg.rollout.uses_server
        engine.close()
    finally:
        servers.close()
