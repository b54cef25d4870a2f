"""HTTP calls to a vLLM server, each bounded by a timeout, every failure a :class:`VLLMServerError`
naming the server (and why it is gone, for a launched one that exited), never a hang."""

from __future__ import annotations

import httpx

from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.vllm_server_process import SERVED_NAME


class ServerClient:
    """HTTP calls to the server, each bounded by ``timeout_s``, failures as :class:`VLLMServerError`."""

    def __init__(self, url: str, timeout_s: float, concurrency: int, why_gone=lambda: None, token: str | None = None):
        self.url = url
        self.timeout_s = timeout_s
        # Idle connections are dropped after 2 s, before the server's own keep-alive timeout
        # (uvicorn: 5 s) can close one under a request we are about to send on it.
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
        headers = {"Authorization": f"Bearer {token}"} if token else None  # every request carries it
        self._http = httpx.Client(base_url=url, timeout=timeout_s, limits=limits, headers=headers)
        self._why_gone = why_gone  # a launched server's exit status, if it exited
        self.model = SERVED_NAME

    def healthy(self) -> bool:
        try:
            return self._http.get("/health", timeout=min(self.timeout_s, 5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def call(self, method: str, path: str, what: str, hint: str = "", **kwargs):
        """One request; ``hint`` is added when the server answers with an error status."""
        try:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.RemoteProtocolError:
                # The server closed a pooled keep-alive connection as we reused it: the request
                # never ran. Once more on a fresh connection (requests are seeded: harmless).
                response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as err:
            raise VLLMServerError(
                f"the vLLM server {self.url} did not answer {what} within rollout.vllm.server.timeout_s="
                f"{self.timeout_s:g} s ({type(err).__name__}){self._gone()}"
            ) from err
        except httpx.HTTPError as err:
            raise VLLMServerError(
                f"the vLLM server {self.url} failed {what}: {type(err).__name__}: {err}{self._gone()}"
            ) from err
        if response.status_code != 200:
            raise VLLMServerError(
                f"the vLLM server {self.url} answered {what} with HTTP {response.status_code}: "
                f"{response.text[:500]}{hint}"
            )
        return response.json()

    def _gone(self) -> str:
        why = self._why_gone()
        return f"; {why}" if why else ""

    def served_model(self) -> str:
        models = self.call("GET", "/v1/models", "GET /v1/models")["data"]
        return models[0]["id"]

    def close(self) -> None:
        self._http.close()
