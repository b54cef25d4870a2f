"""A stand-in for a vLLM server, for fault tests without vLLM: the few routes a run given
``rollout.vllm.server.url`` calls, with completions drawn from each request's prompt and seed (so
two runs get the same ones). ``python fake_vllm_server.py PORT_FILE [DIE_AFTER [RELOAD]]`` writes its
port to PORT_FILE and, with DIE_AFTER, SIGKILLs itself on that completion request: a server killed
mid-step. RELOAD says how a weight reload (``/collective_rpc``) behaves: ``ok``, ``fail`` (HTTP 500,
a reload failed half way), ``fail_once``, ``slow:S`` (answers after S seconds) or ``die`` (SIGKILL).
Scoring requests (``prompt_logprobs``) get -1.0 for every token, each its position's top-1 (rank 1)."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

state = {"version": "0", "completions": 0, "reloads": 0, "adapters": []}


def _completion(body: dict) -> dict:
    prompt = list(body["prompt"])
    if body.get("prompt_logprobs") is not None:
        return {
            "prompt_logprobs": [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in prompt[1:]],
            "finish_reason": "length",
        }
    draw = random.Random(f"{prompt}:{body.get('seed')}")
    tokens = [draw.choice(prompt) for _ in range(int(body["max_tokens"]))]  # valid ids of this tokenizer
    return {"token_ids": tokens, "logprobs": {"token_logprobs": [-1.0] * len(tokens)}, "finish_reason": "length"}


class Handler(BaseHTTPRequestHandler):
    def _answer(self, body: dict) -> None:
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        routes = {"/health": {}, "/v1/models": {"data": [{"id": "policy"}]}, "/weight_info": None}
        if self.path not in routes:
            return self.send_error(404)
        self._answer(
            routes[self.path]
            if self.path != "/weight_info"
            else {"weight_version": state["version"], "reloads": state["reloads"], "adapters": state["adapters"]}
        )

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/v1/completions":
            state["completions"] += 1
            if die_after and state["completions"] > die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            return self._answer({"choices": [_completion(body)]})
        if self.path == "/collective_rpc":
            state["reloads"] += 1
            if reload == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if reload == "fail" or (reload == "fail_once" and state["reloads"] == 1):
                return self.send_error(500, "reload_weights failed half way: size mismatch for layers.1")
            if reload.startswith("slow:"):
                time.sleep(float(reload[5:]))
        if self.path == "/v1/load_lora_adapter":
            state["adapters"].append(body["lora_name"])
        if self.path == "/v1/unload_lora_adapter":
            state["adapters"].remove(body["lora_name"])
        if self.path == "/update_weight_version":
            state["version"] = str(body["new_version"])
        if self.path in (
            "/collective_rpc",
            "/reset_prefix_cache",
            "/update_weight_version",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
        ):
            return self._answer({})
        self.send_error(404)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    die_after = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    reload = sys.argv[3] if len(sys.argv) > 3 else "ok"
    ThreadingHTTPServer.request_queue_size = 64  # the default 5 resets concurrent connects on a loaded machine
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(sys.argv[1]).write_text(str(server.server_address[1]))
    server.serve_forever()
