"""Security of the launched vLLM server without starting one: the port, the bind address, the
identity check and the key of a server given by URL (the token guard on every route of a real
server is tested in test_vllm_server.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import socketserver
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import free_port, make_config, run_worker

from grpo_lightning.config import ConfigError, VLLMConfig, VLLMServerConfig, is_loopback_host, validate_config
from grpo_lightning.errors import ServerError
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout import server_auth, server_guard
from grpo_lightning.rollout.server_auth import identity_proof
from grpo_lightning.rollout.vllm_server import VLLMServerEngine
from grpo_lightning.rollout.vllm_server_client import ServerClient


def launch(**settings):
    tok = build_char_tokenizer()
    return VLLMServerEngine.from_policy(
        build_tiny_policy(tok), tok, VLLMConfig(server=VLLMServerConfig(launch=True, **settings)), seed=0
    )


def test_a_foreign_listener_on_an_explicit_port_fails_the_launch_naming_the_port():
    """A stale server (or anything) on the named port is refused, never attached to; no server starts."""
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        with pytest.raises(
            ServerError, match=rf"rollout.vllm.server.port={port}: something already listens on 127.0.0.1:{port}"
        ):
            launch(port=port)
    assert server_guard.launch_port("127.0.0.1", port) == port  # free again: the explicit port is kept


def test_the_default_port_is_a_free_one_chosen_at_launch():
    """port 0 (the default, in the config: its one source) never picks a port in use."""
    assert VLLMServerConfig().port == 0
    listeners = []
    try:
        for _ in range(20):
            port = server_guard.launch_port("127.0.0.1", 0)
            assert port > 0 and port not in [s.getsockname()[1] for s in listeners]
            listener = socket.socket()
            listener.bind(("127.0.0.1", port))  # it really was free
            listener.listen()
            listeners.append(listener)
    finally:
        for listener in listeners:
            listener.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.7", "::", "example.com"])
def test_a_non_loopback_host_needs_allow_remote(host, capsys):
    assert not is_loopback_host(host)
    cfg = make_config(
        2, **{"rollout.engine": "vllm", "rollout.vllm.server.launch": True, "rollout.vllm.server.host": host}
    )
    with pytest.raises(
        ConfigError, match=rf"rollout.vllm.server.host={host} is not a loopback address.*allow_remote=true"
    ):
        validate_config(cfg)
    with pytest.raises(ServerError, match=rf"rollout.vllm.server.host={host} is not a loopback"):
        launch(host=host)  # settings built by hand are checked too, before anything starts
    cfg.rollout.vllm.server.allow_remote = True
    validate_config(cfg)
    server_guard.check_bind_host(host, allow_remote=True)
    warning = capsys.readouterr().err.strip()
    assert "allow_remote=true" in warning and "token is the only guard" in warning and "\n" not in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts_need_nothing(host):
    assert is_loopback_host(host)
    server_guard.check_bind_host(host, allow_remote=False)


def test_a_launched_server_takes_no_api_key_env():
    cfg = make_config(
        2, **{"rollout.engine": "vllm", "rollout.vllm.server.launch": True, "rollout.vllm.server.api_key_env": "K"}
    )
    with pytest.raises(ConfigError, match="api_key_env=K is for a server given by url="):
        validate_config(cfg)


class Stub(socketserver.BaseRequestHandler):
    """A plain HTTP server that answers 200 to everything (``Stub.answer``) and keeps the
    Authorization headers it saw: a stale or foreign server on the port."""

    answer: ClassVar[dict] = {}
    seen: ClassVar[list[str | None]] = []

    def handle(self):
        head = self.request.recv(65536).decode("latin-1")
        auth = [
            line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("authorization:")
        ]
        Stub.seen.append(auth[0] if auth else None)
        body = json.dumps(Stub.answer).encode()
        self.request.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )


@pytest.fixture
def stub():
    Stub.seen = []
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Stub) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def test_a_server_that_cannot_prove_the_run_token_is_refused(stub, monkeypatch):
    """Identity: the answer must be the HMAC of a fresh nonce under the token, from the launched
    process, for the launched model, and a request without the token must get 401."""
    client = ServerClient(stub, timeout_s=5, concurrency=1, token="run-token")
    nonces = []
    monkeypatch.setattr(server_guard.secrets, "token_hex", lambda n: nonces.append(f"nonce{len(nonces)}") or nonces[-1])
    Stub.answer = {"proof": "guess", "pid": 42, "data": [{"id": "policy"}]}
    with pytest.raises(ServerError, match="is not the vLLM server this run launched: it does not hold the run's token"):
        server_guard.verify_identity(client, "run-token", "policy", pid=42)
    Stub.answer["proof"] = identity_proof("run-token", "nonce0")  # a replayed proof of an earlier nonce
    with pytest.raises(ServerError, match="does not hold the run's token"):
        server_guard.verify_identity(client, "run-token", "policy", pid=42)
    Stub.answer["proof"] = identity_proof("run-token", "nonce2")
    with pytest.raises(ServerError, match="runs as process 42, the launched server is 43"):
        server_guard.verify_identity(client, "run-token", "policy", pid=43)
    Stub.answer["proof"] = identity_proof("run-token", "nonce3")
    with pytest.raises(ServerError, match="serves 'policy', not 'other'"):
        server_guard.verify_identity(client, "run-token", "other", pid=42)
    Stub.answer["proof"] = identity_proof("run-token", "nonce4")
    with pytest.raises(ServerError, match="answers a request without the token with HTTP 200, not 401"):
        server_guard.verify_identity(client, "run-token", "policy", pid=42)
    assert Stub.seen[-1] is None and set(Stub.seen[:-1]) == {"Bearer run-token"}  # every other request carried it
    client.close()


def test_a_server_given_by_url_gets_the_key_named_by_api_key_env(stub, monkeypatch):
    """The key travels in the environment, never in the config; every request carries it."""
    monkeypatch.delenv("GRPO_TEST_KEY", raising=False)
    settings = VLLMConfig(server=VLLMServerConfig(url=stub, api_key_env="GRPO_TEST_KEY", timeout_s=5))
    tok = build_char_tokenizer()
    with pytest.raises(ServerError, match="api_key_env=GRPO_TEST_KEY names an environment variable that is not set"):
        VLLMServerEngine.from_policy(None, tok, settings, seed=0)
    monkeypatch.setenv("GRPO_TEST_KEY", "user-key")
    Stub.answer = {"data": [{"id": "their-model"}]}
    engine = VLLMServerEngine.from_policy(None, tok, settings, seed=0)
    assert engine.client.model == "their-model"
    assert Stub.seen and set(Stub.seen) == {"Bearer user-key"}
    assert "user-key" not in repr(settings)
    engine.close()


def test_the_middleware_fails_closed_and_passes_lifespan_events(monkeypatch):
    """Without a token configured every request is refused; a websocket without the token is
    closed before it is accepted; lifespan events (startup, shutdown) reach the app."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    async def send(message):
        sent.append(message)

    async def call(scope):
        await server_auth.TokenAuthMiddleware(app)(scope, None, send)

    bearer = [(b"authorization", b"Bearer t0k")]
    http = {"type": "http", "path": "/health", "method": "GET", "headers": bearer}
    asyncio.run(call(http))  # no token configured: refused
    assert reached == [] and sent[0]["status"] == 401
    monkeypatch.setattr(server_auth, "_token", "t0k")
    asyncio.run(call(http))
    asyncio.run(call({"type": "lifespan"}))
    assert reached == ["http", "lifespan"]
    sent.clear()
    asyncio.run(call({"type": "websocket", "path": "/v1/realtime", "headers": []}))
    assert sent == [{"type": "websocket.close", "code": 1008}] and reached == ["http", "lifespan"]


@pytest.mark.slow
def test_rank_0_hands_the_port_and_token_to_the_other_ranks_or_its_failure(tmp_path, monkeypatch):
    """With port 0 and a per-run token only rank 0 knows where the server is and how to reach
    it: the others get both from it; when its launch fails they fail with its reason, not hang."""
    monkeypatch.setenv("SHARE_PORT", str(free_port()))
    run_worker(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[2] / "helpers" / "server_share_worker.py"),
            str(tmp_path),
        ],
        120,
        "hand-over",
    )
    reports = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    assert [r["launched"] for r in reports] == [True, False]
    assert {r["url"] for r in reports} == {"http://127.0.0.1:4321"} and {r["token"] for r in reports} == {
        "tok-from-rank-0"
    }
    assert reports[0]["failure"].startswith("rollout.vllm.server.port=1234: something already listens")
    assert reports[1]["failure"].startswith("rank 0 could not launch the vLLM server: rollout.vllm.server.port=1234")
