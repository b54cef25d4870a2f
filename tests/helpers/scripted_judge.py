"""A loopback OpenAI-compatible /chat/completions server whose answers a test scripts (stdlib only)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# reply(prompt_text, headers) -> (status, content) ; a float content means "sleep that long, then 200 'Score: 5'"
Reply = Callable[[str, dict], tuple[int, object]]


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
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                outer.headers.append(dict(self.headers))
                status, content = outer.reply(body["messages"][0]["content"], dict(self.headers))
                if isinstance(content, float):
                    time.sleep(content)
                    content = "Score: 5"
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

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
