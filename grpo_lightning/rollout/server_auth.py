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

The launcher also forks a watchdog into the server's process group (:func:`_watch_trainer`):
vLLM's EngineCore is a separate process, and a server whose trainer dies while it is still
starting ignores the ``PR_SET_PDEATHSIG`` signal, so without it both would outlive the run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import runpy
import signal
import sys
import time
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


def _parent_of(pid: int) -> int | None:
    """``pid``'s parent (Linux ``/proc``), or None if ``pid`` is gone or that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[1])


def _others_in_group(group: int) -> bool:
    """Whether a live process other than this one is in process group ``group`` (Linux ``/proc``)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] not in ("Z", "X"):
                return True
    return False


def _watch_trainer(trainer: int, grace_s: float = 5.0, poll_s: float = 0.25) -> None:
    """Fork a watchdog that, once the trainer (this server's parent) or the server is gone,
    terminates the server's whole process group: SIGTERM, then SIGKILL after ``grace_s``."""
    server = os.getpid()
    if os.fork() != 0:
        return
    try:  # the watchdog: it outlives the server's own SIGTERM, so it can finish the job
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while os.getppid() == server and _parent_of(server) == trainer:
            time.sleep(poll_s)
        group = os.getpgid(0)
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _others_in_group(group) and time.monotonic() < deadline:
            time.sleep(poll_s)
        if _others_in_group(group):
            os.killpg(group, signal.SIGKILL)  # this watchdog included
    finally:
        os._exit(0)


def main() -> None:
    """Take the token out of the environment, then run vLLM's OpenAI API server with the middleware."""
    global _token
    _token = os.environ.pop(TOKEN_ENV, "")
    if not _token:
        sys.exit(f"{TOKEN_ENV} is not set: this launcher serves only requests that carry the run's token")
    if os.path.isdir("/proc") and os.getpgid(0) == os.getpid():  # Linux, in its own group (a launch)
        _watch_trainer(os.getppid())
    sys.modules[ALIAS] = sys.modules[__name__]
    sys.argv += ["--middleware", f"{ALIAS}.TokenAuthMiddleware"]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
