"""A loopback OpenAI-compatible /chat/completions server whose answers a test scripts (stdlib only).

``reply(prompt_text, headers) -> (status, content)``: a str content is the judge's message; a
float means "sleep that long, then 200 'Score: 5'"; with a 3xx status the content is the
``Location``; a :class:`Trickle` sends its message one byte every ``delay`` seconds (``headers``:
the status line and headers too). Every request is recorded, POST or not, with its headers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = Callable[[str, dict], tuple[int, object]]


@dataclass(frozen=True)
class Trickle:
    """An answer sent one byte every ``delay`` seconds (with ``headers``, the status line and headers too)."""

    content: str
    delay: float
    headers: bool = False


class _Server(ThreadingHTTPServer):
    # The listen backlog: socketserver's default of 5 is below a judge client's concurrency (8 in
    # benchmarks/reward_sources_cost.py), and a connection the full backlog drops waits for TCP's
    # 1 s SYN retransmit: the benchmark timed those waits, not the client.
    request_queue_size = 128


class ScriptedJudge:
    def __init__(self, reply: Reply):
        self.reply = reply
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.headers.append(dict(self.headers))
                try:
                    body = json.loads(raw)
                    text = body["messages"][0]["content"]
                except (ValueError, KeyError, IndexError, TypeError):
                    body, text = {"method": self.command, "path": self.path}, ""
                outer.requests.append(body)
                status, content = outer.reply(text, dict(self.headers))
                if isinstance(content, float):
                    time.sleep(content)
                    content = "Score: 5"
                try:
                    self.answer(status, content)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            do_GET = do_POST  # noqa: N815 (a redirected request may come back as a GET)

            def answer(self, status, content):
                if 300 <= status < 400:
                    self.send_response(status)
                    self.send_header("Location", content)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                message = content.content if isinstance(content, Trickle) else content
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": message}}]}).encode()
                head = (
                    f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n"
                ).encode()
                if not isinstance(content, Trickle):
                    self.wfile.write(head + data)
                    return
                if not content.headers:
                    self.wfile.write(head)
                    self.wfile.flush()
                for byte in (head if content.headers else b"") + data:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(content.delay)

            def log_message(self, *args):
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads, self.server.block_on_close = True, False  # a sleeping handler never blocks exit
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def __enter__(self) -> ScriptedJudge:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
