"""One POST to the judge: a deadline for the whole request, no redirects, a capped answer.

``urllib`` bounds each socket read, not the request (a server that trickles a byte a second
holds a 2 s timeout for as long as it likes), and follows redirects with the request's headers,
the API key included, to whatever host the ``Location`` names (https to http too). Here the
whole request, from connecting to the last byte, must fit in ``timeout_s`` (a timer shuts the
socket down when it does not), a 3xx answer is never followed, and an answer larger than
``max_bytes`` is refused. ``HTTPS_PROXY`` / ``HTTP_PROXY`` (and ``NO_PROXY``) apply as in urllib.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request


class Redirected(Exception):
    """The judge answered 3xx: ``status`` and the ``location`` it named (not followed)."""

    def __init__(self, status: int, location: str):
        super().__init__(f"HTTP {status} to {location or '(no Location)'}")
        self.status, self.location = status, location


class StatusError(Exception):
    """The judge answered HTTP 4xx or 5xx."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status} {reason}")
        self.status = status


class TooLarge(Exception):
    """An answer larger than the cap."""


def post(url: str, payload: bytes, headers: dict[str, str], timeout_s: float, max_bytes: int) -> bytes:
    """The body of the 2xx answer to a POST of ``payload`` to ``url``, or one of the errors above,
    ``TimeoutError`` (past ``timeout_s`` in all), ``OSError`` or ``http.client.HTTPException``."""
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout_s
    connection, target = _connection(parts, timeout_s)
    cut = threading.Event()

    def on_deadline() -> None:
        cut.set()
        if connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once
            except OSError:
                pass

    timer = threading.Timer(timeout_s, on_deadline)
    timer.daemon = True
    timer.start()
    try:
        connection.connect()
        if cut.is_set():
            raise TimeoutError
        connection.request("POST", target, body=payload, headers=headers)
        response = connection.getresponse()
        if 300 <= response.status < 400:
            raise Redirected(response.status, response.getheader("Location", ""))
        if response.status >= 400:
            raise StatusError(response.status, response.reason)
        body = response.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise TooLarge(f"an answer larger than {max_bytes // 1024} KiB")
        if cut.is_set():
            raise TimeoutError
        return body
    except (OSError, http.client.HTTPException) as err:
        if cut.is_set() or time.monotonic() >= deadline:
            raise TimeoutError(f"no complete answer within timeout_s={timeout_s:g} s") from None
        raise err
    finally:
        timer.cancel()
        connection.close()


def _connection(parts: urllib.parse.SplitResult, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """The connection (through the environment's proxy when one applies) and the request target."""
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if https:
            connection = http.client.HTTPSConnection(
                through.hostname, through.port or 80, timeout=timeout_s, context=ssl.create_default_context()
            )
            connection.set_tunnel(host, port)
            return connection, path
        return http.client.HTTPConnection(through.hostname, through.port or 80, timeout=timeout_s), parts.geturl()
    if https:
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=ssl.create_default_context()), path
    return http.client.HTTPConnection(host, port, timeout=timeout_s), path
