"""Trainer-side checks that the vLLM server a run talks to is the one it launched, and nobody else's.

A launched server listens on a loopback address unless ``allow_remote`` says otherwise, on a
free port unless one is named (a port something already listens on is refused, never attached
to: a stale server from an earlier run would otherwise train as if it were ours), and answers
only requests carrying a random per-run token (:mod:`grpo_lightning.rollout.server_auth`). Once
healthy it must prove that it holds the token (an HMAC of a fresh nonce), run in the process we
started, serve the model we launched, and refuse a request without the token.
"""

from __future__ import annotations

import errno
import hmac
import os
import secrets
import socket
import sys

import httpx

from grpo_lightning.config import is_loopback_host
from grpo_lightning.errors import ServerError
from grpo_lightning.rollout.engine import EngineError
from grpo_lightning.rollout.server_auth import IDENTITY_PATH, identity_proof


class VLLMServerError(EngineError, ServerError):
    """The vLLM server refused, failed, timed out or exited; the message names it."""


def _error(message: str) -> Exception:
    return VLLMServerError(message)


def check_bind_host(host: str, allow_remote: bool) -> None:
    """Refuse a non-loopback ``host`` unless ``allow_remote``; then warn that the token is the only guard."""
    if is_loopback_host(host):
        return
    if not allow_remote:
        raise _error(
            f"rollout.vllm.server.host={host} is not a loopback address: anyone on the network could call the "
            f"launched server; use 127.0.0.1, or set rollout.vllm.server.allow_remote=true"
        )
    print(
        f"[grpo_lightning] warning: the vLLM server listens on {host} (rollout.vllm.server.allow_remote=true): "
        f"its random per-run token is the only guard against other machines",
        file=sys.stderr,
        flush=True,
    )


def _family(host: str) -> socket.AddressFamily:
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def launch_port(host: str, port: int) -> int:
    """``port`` if nothing listens on it (else an error naming it); 0: a port free right now."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR: a closed connection in TIME_WAIT does not count, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise _error(f"cannot listen on rollout.vllm.server.host={host} port={port}: {err}") from err
            raise _error(
                f"rollout.vllm.server.port={port}: something already listens on {host}:{port} (a server from an "
                f"earlier run?); a launched server never attaches to it: stop it, or set rollout.vllm.server.port=0 "
                f"for a free port"
            ) from err
        return probe.getsockname()[1]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def api_key_from_env(name: str | None) -> str | None:
    """The key in environment variable ``name`` (``rollout.vllm.server.api_key_env``); None without a name."""
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise _error(f"rollout.vllm.server.api_key_env={name} names an environment variable that is not set or empty")
    return key


def verify_identity(client, token: str, served_name: str, pid: int | None = None) -> None:
    """Refuse the server at ``client.url`` unless it holds ``token``, runs as ``pid`` (when known),
    serves ``served_name`` and answers a request without the token with 401."""
    nonce = secrets.token_hex(16)
    not_ours = f"the server at {client.url} is not the vLLM server this run launched"
    try:
        answer = client.call("GET", IDENTITY_PATH, "the identity check", params={"nonce": nonce})
    except Exception as err:
        raise _error(f"{not_ours}: {err}") from err
    if not hmac.compare_digest(str(answer.get("proof")), identity_proof(token, nonce)):
        raise _error(f"{not_ours}: it does not hold the run's token")
    if pid is not None and answer.get("pid") != pid:
        raise _error(f"{not_ours}: it runs as process {answer.get('pid')}, the launched server is {pid}")
    if (model := client.served_model()) != served_name:
        raise _error(f"{not_ours}: it serves {model!r}, not {served_name!r}")
    try:
        status = httpx.get(f"{client.url}/health", timeout=client.timeout_s).status_code
    except httpx.HTTPError as err:
        raise _error(f"{not_ours}: {type(err).__name__}: {err}") from err
    if status != 401:
        raise _error(f"{not_ours}: it answers a request without the token with HTTP {status}, not 401")
