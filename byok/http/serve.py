"""Run an ASGI app with hypercorn inside a caller-owned trio nursery.

The daemon and the integration tests start servers the same way, so tests exercise the
production server settings (timeouts, logging, protocol switches) rather than a look-alike.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any

import hypercorn.trio
import hypercorn.trio.run
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

server_log = logging.getLogger("byok.http.server")

_H2_REFUSED = b"HTTP/2 is disabled on this server\n"


KEEP_ALIVE_TIMEOUT_S = 300.0


class ReleasingTCPServer(TCPServer):
    """hypercorn's trio connection, let go once the client has closed it.

    hypercorn 0.18 reads the EOF of a keep-alive connection that is idle between requests,
    but its keep-alive timer goes on running, and the connection's task group waits for it:
    the socket and ~13 KB stayed for KEEP_ALIVE_TIMEOUT_S after every connection a client
    closed idle (its pool's own idle expiry). Nothing is read once the reading loop ends, so
    the timer is stopped then. (A connection closed mid-request was always released.)"""

    async def _read_data(self) -> None:
        await super()._read_data()  # returns at EOF or a broken connection (an OSError raises)
        await self.idle_task.stop()


# The class hypercorn's trio worker makes each connection with (a module global it looks up).
hypercorn.trio.run.TCPServer = ReleasingTCPServer  # type: ignore[misc]


def _bind_address(host: str, port: int) -> str:
    # hypercorn parses "host:port" with rsplit(":"); IPv6 literals need brackets.
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def server_config(host: str, port: int) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [_bind_address(host, port)]
    # Requests are logged by the app (the forwarder logs method/path/status/duration); the
    # access log would only duplicate them. Server errors go through normal logging.
    config.accesslog = None
    config.errorlog = server_log
    # Forwarded responses carry upstream's own Server header; don't add a second one.
    config.include_server_header = False
    # Agent streams stay open for minutes with long quiet gaps: no read timeout.
    config.read_timeout = None
    # An idle keep-alive connection is closed after this. hypercorn's 5 s default equals common
    # clients' own idle expiry (httpx: 5 s), so a client could reuse a connection just as it was
    # being closed and lose that append ("server disconnected without sending a response", seen
    # in the benchmarks). The server must be the side that waits longer.
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT_S
    # On shutdown, give in-flight streams a moment to finish their end-stream frame.
    config.graceful_timeout = 5.0
    return config


def _http1_only(app: ASGIApp) -> ASGIApp:
    """Refuse HTTP/2 requests with 505.

    hypercorn always accepts cleartext HTTP/2 (prior knowledge and ``Upgrade: h2c``) and has
    no switch to turn that off, so the refusal has to happen per request in the app.
    """

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("http_version") == "2":
            await send(
                {
                    "type": "http.response.start",
                    "status": 505,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(_H2_REFUSED)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _H2_REFUSED})
            return
        await app(scope, receive, send)

    return wrapped


async def serve_app(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    nursery: trio.Nursery,
    h2c: bool = True,
) -> tuple[str, Callable[[], None]]:
    """Start serving ``app`` on ``host:port`` (``port=0``: any free port) in ``nursery``.

    Returns once the socket is listening, with the base URL actually bound (e.g.
    ``http://127.0.0.1:54321``) and a function that starts a graceful shutdown: stop
    accepting, let in-flight requests run for up to ``graceful_timeout``, then cancel them.
    The server task then ends and the nursery can exit. Binding errors (port in use) raise
    here. HTTP/1.1 is always served; ``h2c`` also allows cleartext HTTP/2, which Cursor
    uses for bidirectional streams.

    ``app`` must either implement the ASGI lifespan protocol or raise on a lifespan scope:
    hypercorn fails to start if the lifespan call simply returns.
    """
    config = server_config(host, port)
    shutdown = trio.Event()
    served = app if h2c else _http1_only(app)
    binds: list[str] = await nursery.start(
        partial(hypercorn.trio.serve, served, config, shutdown_trigger=shutdown.wait, mode="asgi")
    )
    return binds[0], shutdown.set
