"""A ``rollout.vllm.server.url`` where something other than a vLLM server answers (issue 46): it
waited the whole ``timeout_s`` (300 s) without a word. Each kind of wrong answer now fails at once,
in one line saying what answered; a vLLM server still loading is waited for, and that is said."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpo_lightning.rollout import vllm_server_client
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.vllm_server_client import ServerClient


def serve(answer):
    """An HTTP server on a free loopback port whose GETs ``answer(path, count) -> (status, headers, body)``."""
    calls = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            calls["n"] += 1
            status, headers, body = answer(self.path, calls["n"])
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def web_page(path, count):
    if path == "/":
        return 200, {"Content-Type": "text/html"}, b"<html>welcome</html>"
    return 404, {"Server": "nginx/1.25", "Content-Type": "text/html"}, b"<html><h1>404 Not Found</h1></html>"


def answers_everything(path, count):
    return 200, {"Content-Type": "text/html"}, b"<html>login</html>"


def loading_then_up(path, count):
    if path == "/health":
        return (503, {}, b"") if count <= 2 else (200, {}, b"")
    return 200, {"Content-Type": "application/json"}, json.dumps({"data": [{"id": "policy"}]}).encode()


def expect_one_line(url: str, says: tuple[str, ...], within_s: float) -> None:
    client = ServerClient(url, timeout_s=300.0, concurrency=1)
    start = time.monotonic()
    try:
        with pytest.raises(VLLMServerError) as refused:
            client.wait_up()
    finally:
        client.close()
    message = str(refused.value)
    assert time.monotonic() - start < within_s and len(message.splitlines()) == 1, message
    for word in (url, "not a vLLM server", "rollout.vllm.server.url", *says):
        assert word in message, message


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (web_page, ("HTTP 404", "nginx/1.25", "404 Not Found")),
        (answers_everything, ("GET /v1/models", "'<html>login</html>'")),
    ],
)
def test_a_url_where_another_server_answers_fails_at_once_saying_what_answered(answer, says):
    server, url = serve(answer)
    try:
        expect_one_line(url, says, within_s=5.0)
    finally:
        server.shutdown()


def test_a_port_that_accepts_but_never_speaks_http_fails_after_the_probe(monkeypatch):
    monkeypatch.setattr(vllm_server_client, "PROBE_S", 0.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)  # accepted by the kernel, never answered
    try:
        expect_one_line(f"http://127.0.0.1:{listener.getsockname()[1]}", ("sent no answer to GET /health",), 5.0)
    finally:
        listener.close()


def test_a_vllm_server_still_loading_is_waited_for_and_the_wait_is_said(caplog):
    server, url = serve(loading_then_up)
    client = ServerClient(url, timeout_s=30.0, concurrency=1)
    caplog.set_level(logging.WARNING, logger=vllm_server_client.__name__)
    try:
        assert client.wait_up() < 10
    finally:
        client.close()
        server.shutdown()
    (said,) = [r.getMessage() for r in caplog.records]
    assert "answers GET /health with HTTP 503 (still loading?): waiting for it" in said
