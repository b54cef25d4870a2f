"""HTTP calls to a vLLM server, each bounded by a timeout, every failure a :class:`VLLMServerError`
naming the server (and why it is gone, for a launched one that exited), never a hang.

A server given by URL is probed before it is waited for: a URL where something else answers (a web
server's 404, a login page, a port that accepts connections but never speaks HTTP) waited the whole
``timeout_s`` (300 s) without a word. Now such an answer fails at once, in one line saying what
answered; a vLLM server that is still loading (HTTP 5xx) is waited for, and the wait is said."""

from __future__ import annotations

import logging
import time

import httpx

from grpo_lightning.config.rollout import CONNECT_TIMEOUT_S
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.vllm_server_process import SERVED_NAME

log = logging.getLogger(__name__)
PROBE_S = 10.0  # a vLLM server answers /health at once once it listens (even under load): longer is not one


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT_S))


class ServerClient:
    """HTTP calls to the server, each bounded by ``timeout_s``, failures as :class:`VLLMServerError`."""

    def __init__(self, url: str, timeout_s: float, concurrency: int, why_gone=lambda: None, token: str | None = None):
        self.url = url
        self.timeout_s = timeout_s
        # Idle connections are dropped after 2 s, before the server's own keep-alive timeout
        # (uvicorn: 5 s) can close one under a request we are about to send on it.
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
        headers = {"Authorization": f"Bearer {token}"} if token else None  # every request carries it
        self._http = httpx.Client(base_url=url, timeout=_timeout(timeout_s), limits=limits, headers=headers)
        self._why_gone = why_gone  # a launched server's exit status, if it exited
        self.model = SERVED_NAME

    def healthy(self) -> bool:
        try:
            return self._http.get("/health", timeout=min(self.timeout_s, 5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_up(self, rank: int = 0, starting_s: float | None = None) -> float:
        """A server given by URL: wait for ``/health`` to answer 200, at most ``timeout_s``; returns
        the seconds it took. A refused connection (nothing listens there) or a key the server
        refuses fails at once: waiting cannot fix either. ``starting_s``: a server another rank
        has just launched, which may not listen yet; refused connections are retried that long."""
        start = time.perf_counter()
        deadline = start + (starting_s if starting_s is not None else self.timeout_s)
        where = f"the vLLM server {self.url} (rank {rank})"
        advice = "; start it, or check rollout.vllm.server.url (or launch one: rollout.vllm.server.launch=true)"
        given = starting_s is None  # a URL the user gave: anything may answer there
        said_waiting = False
        while True:
            left = max(deadline - time.perf_counter(), 0.01)
            try:
                response = self._http.get("/health", timeout=_timeout(min(left, PROBE_S) if given else left))
                status = response.status_code
            except httpx.ConnectError as err:
                if given or time.perf_counter() + 0.5 > deadline:
                    raise self._failure(err, f"GET /health (rank {rank})", advice) from err
                time.sleep(0.5)
                continue
            except httpx.ReadTimeout as err:
                if given and left > PROBE_S:
                    raise VLLMServerError(
                        f"{where} accepted the connection but sent no answer to GET /health within {PROBE_S:g} s "
                        f"(a vLLM server answers at once): not a vLLM server?{advice}"
                    ) from err
                raise self._failure(err, f"GET /health (rank {rank})", advice) from err
            except httpx.HTTPError as err:  # garbage instead of HTTP: RemoteProtocolError
                raise self._failure(err, f"GET /health (rank {rank})", advice) from err
            if status == 200:
                if given:
                    self._is_vllm(where, advice)
                return time.perf_counter() - start
            if given and status != 401 and status < 500:  # 3xx, 404, 403...: something else answers there
                raise VLLMServerError(
                    f"{where} answered GET /health with HTTP {status} ({_what(response)}): not a vLLM server{advice}"
                )
            if given and status >= 500 and not said_waiting:
                said_waiting = True
                log.warning(
                    f"{where} answers GET /health with HTTP {status} (still loading?): waiting for it, at most "
                    f"rollout.vllm.server.timeout_s={self.timeout_s:g} s"
                )
            if status == 401:
                raise VLLMServerError(
                    f"{where} refused GET /health with HTTP 401: it wants a key; name the environment variable "
                    f"holding it with rollout.vllm.server.api_key_env"
                )
            if time.perf_counter() + 0.5 > deadline:
                raise VLLMServerError(
                    f"{where} still answered GET /health with HTTP {status} after rollout.vllm.server.timeout_s="
                    f"{self.timeout_s:g} s"
                )
            time.sleep(0.5)  # a server still loading its model answers 503

    def _is_vllm(self, where: str, advice: str) -> None:
        """``/v1/models`` lists the served models, as a vLLM (OpenAI-compatible) server's does."""
        response, data = None, None
        try:
            response = self._http.get("/v1/models", timeout=_timeout(PROBE_S))
            data = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):  # no answer, not JSON, not an object
            pass
        if not isinstance(data, list):
            answered = "no answer" if response is None else f"HTTP {response.status_code}, {_what(response)}"
            raise VLLMServerError(
                f"{where} answered GET /health but not GET /v1/models as a vLLM server does ({answered}): "
                f"not a vLLM server{advice}"
            )

    def call(self, method: str, path: str, what: str, hint: str = "", **kwargs):
        """One request; ``hint`` is added when the server answers with an error status."""
        try:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.RemoteProtocolError:
                # The server closed a pooled keep-alive connection as we reused it: the request
                # never ran. Once more on a fresh connection (requests are seeded: harmless).
                response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise self._failure(err, what) from err
        if response.status_code != 200:
            raise VLLMServerError(
                f"the vLLM server {self.url} answered {what} with HTTP {response.status_code}: "
                f"{' '.join(response.text[:500].split())}{hint}"
            )
        # vLLM answers a few routes (the LoRA ones) in plain text.
        return response.json() if "json" in response.headers.get("content-type", "") else response.text

    def _failure(self, err: httpx.HTTPError, what: str, advice: str = "") -> VLLMServerError:
        """``err`` (a timeout, a refused connection, ...) as one line naming the server."""
        if isinstance(err, httpx.TimeoutException):
            why = f"did not answer {what} within rollout.vllm.server.timeout_s={self.timeout_s:g} s ({type(err).__name__})"
        else:
            why = f"failed {what}: {type(err).__name__}: {err}"
        return VLLMServerError(f"the vLLM server {self.url} {why}{self._gone()}{advice}")

    def _gone(self) -> str:
        why = self._why_gone()
        return f"; {why}" if why else ""

    def served_model(self) -> str:
        models = self.call("GET", "/v1/models", "GET /v1/models")["data"]
        return models[0]["id"]

    def close(self) -> None:
        self._http.close()


def _what(response: httpx.Response) -> str:
    """Who answered, in a few words: its Server header and the start of its body."""
    server = response.headers.get("server")
    body = " ".join(response.text[:80].split())
    return ", ".join(
        part for part in (f"server {server!r}" if server else "", repr(body) if body else "empty body") if part
    )
