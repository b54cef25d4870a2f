"""Weight-sync faults against a stand-in server (tests/helpers/fake_vllm_server.py): a reload that
fails half way, one that blocks past rollout.vllm.sync.timeout_s, a server killed mid-sync, and a
canary the engine scores differently. Each ends in a one-line ServerError within its timeout (or
a retry that succeeds), and none bumps the version the server reports."""

from __future__ import annotations

import socket
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from helpers.fake_server_engine import FakeServers, held

from grpo_lightning.errors import ServerError
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.sync_watchdog import SyncTimeout
from grpo_lightning.rollout.vllm_server import ServerClient, VLLMServerError
from grpo_lightning.rollout.weight_sync import ProbeScores, WeightSync, WeightSyncError


@pytest.fixture
def server(tmp_path):
    """``server(reload_mode, timeout_s=..., retries=...)``: a fake server and an engine connected to it."""
    servers = FakeServers(tmp_path)

    def start(reload: str = "ok", timeout_s: float = 10.0, retries: int = 0):
        return servers.start(reload, timeout_s=timeout_s, retries=retries)

    yield start
    servers.close()


def _weights(version: int = 5) -> PolicyWeights:
    return PolicyWeights([("w", torch.ones(3))], version)


def test_a_reload_that_fails_half_way_is_an_error_and_leaves_the_version(server):
    engine, _ = server("fail")
    with pytest.raises(VLLMServerError) as caught:
        engine.load_weights(_weights().tensors, version=5)
    assert "half way" in str(caught.value) and "\n" not in str(caught.value)
    assert held(engine)["weight_version"] == "0" and engine.weight_version is None


def test_a_failed_reload_is_retried_and_the_retry_bumps_the_version_once(server):
    engine, _ = server("fail_once", retries=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.load_weights(_weights().tensors, version=5)
    assert any("attempt 1 of 2" in str(w.message) and "retrying" in str(w.message) for w in caught)
    assert held(engine)["weight_version"] == "5" and held(engine)["reloads"] == 2 and engine.weight_version == 5


def test_a_reload_that_blocks_ends_within_the_timeout_and_never_commits_later(server):
    engine, _ = server("slow:2.0", timeout_s=0.5)
    start = time.perf_counter()
    with pytest.raises(SyncTimeout) as caught:
        engine.load_weights(_weights().tensors, version=5)
    assert time.perf_counter() - start < 1.5
    assert isinstance(caught.value, ServerError) and "rollout.vllm.sync.timeout_s=0.5" in str(caught.value)
    time.sleep(2.0)  # the abandoned reload has answered by now: its version bump must not follow
    assert held(engine)["weight_version"] == "0" and engine.weight_version is None


def test_a_server_killed_mid_sync_is_a_clear_error_at_once(server):
    engine, process = server("die", timeout_s=5.0)
    start = time.perf_counter()
    with pytest.raises(VLLMServerError) as caught:
        engine.load_weights(_weights().tensors, version=5)
    assert time.perf_counter() - start < 3.0 and process.wait(5) != 0
    assert engine.client.url in str(caught.value) and "weight reload" in str(caught.value)
    assert engine.weight_version is None


def _canary(logprob: float) -> ProbeScores:
    prompt, completion = WeightSync.probe_ids()
    return ProbeScores(prompt, completion, torch.full((len(completion),), logprob))


def test_a_canary_the_engine_scores_differently_fails_the_sync_before_the_version_bump(server):
    engine, _ = server("ok")
    sync = WeightSync(verify=True, tolerance=1e-3)
    with pytest.raises(WeightSyncError, match="canary"):
        sync.sync(_weights(), engine, _canary(-2.0))  # the fake scores every token -1.0
    assert held(engine)["weight_version"] == "0" and sync.num_syncs == 0
    metrics = sync.sync(_weights(6), engine, _canary(-1.0))
    assert metrics["rollout/sync_probe_diff"] == 0.0 and held(engine)["weight_version"] == "6"


def test_other_ranks_wait_for_the_version_no_longer_than_rank_0s_attempts(server):
    engine, _ = server("ok", timeout_s=0.2, retries=0)  # rank 0 never pushes version 9
    start = time.perf_counter()
    with pytest.raises(VLLMServerError, match="rank 0's sync failed or hangs"):
        engine._wait_for_version(9)
    assert time.perf_counter() - start < 0.2 + 2.0 + 1.0


def test_a_rank_waiting_for_a_server_another_rank_launches_retries_refused_connections():
    """A launched server does not listen at once: ranks other than its launcher wait for it
    (start_timeout_s), where a server given by URL that refuses fails at once."""
    client = ServerClient(f"http://127.0.0.1:{_free_port()}", timeout_s=5.0, concurrency=1)
    with pytest.raises(VLLMServerError, match="Connection refused|ConnectError"):
        client.wait_up(1)
    late = threading.Timer(1.0, lambda: servers.append(_serve_health(client.url)))
    servers: list = []
    late.start()
    try:
        assert 0.9 < client.wait_up(1, starting_s=10.0) < 5.0
    finally:
        late.join()
        for server in servers:
            server.shutdown()
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_health(url: str):
    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", int(url.rsplit(":", 1)[1])), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
