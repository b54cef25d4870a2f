"""The launched vLLM server's own guard: every route answers only requests that carry the run's token.

Why our own: vLLM's ``--api-key`` guards ``/v1/*`` only; ``/collective_rpc`` (weight reloads),
the other dev-mode routes, ``/health``, ``/version`` and ``/metrics`` stay open to anyone who
can reach the port. :class:`TokenAuthMiddleware` is an ASGI middleware in front of the whole
app: a request without ``Authorization: Bearer <token>`` gets 401, whatever its route or method.
It also answers ``GET /grpo/identity?nonce=N`` with an HMAC of the nonce under the token and its
process id, so the trainer can tell the server it launched from anything else on the port.

This file is the server's entry point (``python -P server_auth.py <vllm api_server args>``):
it imports only the standard library at module level, so the server process never imports
``grpo_lightning`` (nor its dependencies). The token comes in the ``TOKEN_ENV`` environment
variable, never on the command line (``ps`` shows argv), and is removed from the environment
before vLLM starts its own child processes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from urllib.parse import parse_qs

TOKEN_ENV = "GRPO_SERVER_TOKEN"
IDENTITY_PATH = "/grpo/identity"
ALIAS = "grpo_vllm_server_auth"  # the name vLLM's --middleware imports this module by

_token: str | None = None  # set by main(); None: every request is refused


def identity_proof(token: str, nonce: str) -> str:
    """What a server holding ``token`` answers to ``nonce``; nothing else can compute it."""
    return hmac.new(token.encode(), b"grpo-identity:" + nonce.encode(), hashlib.sha256).hexdigest()


def _authorized(scope) -> bool:
    if not _token:
        return False
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            digest = hashlib.sha256(given.encode()).digest()
            return scheme.lower() == "bearer" and hmac.compare_digest(digest, hashlib.sha256(_token.encode()).digest())
    return False


async def _json(send, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class TokenAuthMiddleware:
    """Pure ASGI: 401 for every HTTP request without the token (OPTIONS included), a closed
    socket for every such websocket; lifespan events pass through."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if not _authorized(scope):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _json(send, 401, {"error": "Unauthorized: this server needs the run's token"})
        if scope["type"] == "http" and scope["path"] == IDENTITY_PATH:
            nonce = parse_qs(scope.get("query_string", b"").decode()).get("nonce", [""])[0]
            return await _json(send, 200, {"proof": identity_proof(_token, nonce), "pid": os.getpid()})
        return await self.app(scope, receive, send)


def main() -> None:
    """Take the token out of the environment, then run vLLM's OpenAI API server with the middleware."""
    global _token
    import runpy

    _token = os.environ.pop(TOKEN_ENV, "")
    if not _token:
        sys.exit(f"{TOKEN_ENV} is not set: this launcher serves only requests that carry the run's token")
    sys.modules[ALIAS] = sys.modules[__name__]
    sys.argv += ["--middleware", f"{ALIAS}.TokenAuthMiddleware"]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
