"""verifiers 0.4 (``verifiers.v1``): our engine as the model its training client calls.

verifiers' training client (``TrainClientConfig``) renders each request to token ids itself (the
``renderers`` package) and posts them to vLLM's token-in endpoint ``POST /inference/v1/generate``;
the ids it gets back, with their log-probs, become its trace (``Trace.branches[i].token_ids``,
``sampled_mask``, ``logprobs``): exactly what was sampled, never re-tokenized. :class:`GenerateServer`
serves that endpoint on loopback from any engine of ours (HF, in-process vLLM, the vLLM server), so a
verifiers environment can play against the policy being trained. We do not import ``verifiers``
(its pins clash with ours): it runs from its own venv. Its traces become a training batch in
``verifiers_traces.py``; ``verifiers_rollout.py`` trains on a verifiers environment.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from grpo_lightning.rollout.engine import GenerationRequest, RolloutEngine, Sampling

ENDPOINT = "/inference/v1/generate"


def generate_response(engine: RolloutEngine, body: dict[str, Any], default: Sampling, seed: int) -> dict[str, Any]:
    """The endpoint's answer to one request ``body`` (``token_ids``, ``sampling_params``): the sampled ids
    cut after the first of the client's ``stop_token_ids``, each with its log-prob as ``token_id:<id>``."""
    params = body.get("sampling_params") or {}
    prompt = [int(i) for i in body["token_ids"]]
    sampling = Sampling(
        max_new_tokens=int(params.get("max_tokens") or default.max_new_tokens),
        temperature=float(params.get("temperature", default.temperature)),
        top_p=float(params.get("top_p", default.top_p)),
        top_k=max(int(params.get("top_k", default.top_k)), 0),
    )
    (completion,) = engine.generate([GenerationRequest(prompt, int(params.get("seed", seed)))], sampling)
    ids, logprobs = list(completion.token_ids), list(completion.logprobs or [])
    if len(logprobs) != len(ids):
        raise ValueError("the engine returned no log-probs; verifiers' client needs one per sampled token")
    stops = {int(i) for i in params.get("stop_token_ids") or []}
    cut = next((k + 1 for k, token in enumerate(ids) if token in stops), None)
    finished = completion.finished or cut is not None
    ids, logprobs = ids[:cut], logprobs[:cut]
    content = [{"token": f"token_id:{token}", "logprob": float(lp)} for token, lp in zip(ids, logprobs, strict=True)]
    return {
        "request_id": uuid.uuid4().hex,
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "token_ids": ids,
                "logprobs": {"content": content},
                "finish_reason": "stop" if finished else "length",
            }
        ],
    }


class GenerateServer:
    """``POST /inference/v1/generate`` (and ``GET /v1/models``) on loopback, answered by ``engine``.

    Requests are served one at a time (engines are not thread-safe); each without a ``seed`` gets
    the next of a counter from ``seed``, so a run is replayable. Use as a context manager."""

    def __init__(self, engine: RolloutEngine, sampling: Sampling, model: str = "policy", seed: int = 0):
        self.engine, self.sampling, self.model = engine, sampling, model
        self._seed, self._lock = seed, threading.Lock()
        self.requests: list[dict[str, Any]] = []  # every body served, in order
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._http.serve_forever, name="verifiers-generate", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(body)
            self._seed += 1
            return generate_response(self.engine, body, self.sampling, self._seed)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._send(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:  # noqa: N802
                if self.path != ENDPOINT:
                    self._send(404, {"error": f"no route {self.path}; verifiers posts to {ENDPOINT}"})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    self._send(200, server.answer(body))
                except (KeyError, TypeError, ValueError) as err:
                    self._send(400, {"error": f"{type(err).__name__}: {err}"})

            def log_message(self, *args: Any) -> None:  # quiet: one line per request otherwise
                pass

        return Handler

    def __enter__(self) -> GenerateServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
