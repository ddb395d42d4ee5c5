"""Run an ASGI app with hypercorn inside a caller-owned trio nursery.

The daemon and the integration tests start servers the same way, so tests exercise the
production server settings (timeouts, logging, protocol switches) rather than a look-alike.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any

import h11
import hypercorn.protocol
import hypercorn.trio
import hypercorn.trio.run
import trio
from h2.exceptions import ProtocolError
from h2.frame_buffer import FrameBuffer
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hyperframe.frame import Frame

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

server_log = logging.getLogger("byok.http.server")


def _not_running_on(record: logging.LogRecord) -> bool:
    # hypercorn announces each bind ("Running on http://... (CTRL + C to quit)"); the daemon's
    # start-up summary already says where it listens.
    return not str(record.msg).startswith("Running on ")


server_log.addFilter(_not_running_on)

_H2_REFUSED = b"HTTP/2 is disabled on this server\n"


KEEP_ALIVE_TIMEOUT_S = 300.0
# How long a client may keep the server waiting, in all, for what it has begun to send: a
# request's head (from the connection's opening, or the head's first byte on a kept-alive
# one), then its body; on HTTP/2 the first request, then any frame once begun. Cursor is on
# the same machine and sends each request whole at once; a client dripping bytes (slowloris)
# held a socket and a descriptor for ever. Time the app takes to read what came (a relayed
# upload held back by a slow upstream) is not counted.
REQUEST_READ_TIMEOUT_S = 30.0

Phase = tuple[str, int]


def unfinished(protocol: H11Protocol | H2Protocol) -> Phase | None:
    """What the client has begun and not finished sending, with a count that moves on when a
    new one begins (the read timer starts over then); None when the server waits on nothing
    of the client's (an app writing a long stream, an idle kept-alive connection)."""
    if isinstance(protocol, H2Protocol):
        if not protocol.keep_alive_requests:
            return ("head", 0)  # the preface, its SETTINGS and the first request
        frames = protocol.connection.incoming_buffer
        if isinstance(frames, CheckedFrameBuffer) and frames.partial:
            return ("frame", frames.frames)
        return None
    connection = protocol.connection
    if not isinstance(connection, h11.Connection):  # a WebSocket (byok serves none)
        return None
    requests = protocol.keep_alive_requests  # counted once a request's head is complete
    if connection.their_state is h11.SEND_BODY:
        return ("body", requests)
    if connection.their_state is h11.IDLE and (not requests or connection.trailing_data[0]):
        return ("head", requests)
    return None


class ReleasingTCPServer(TCPServer):
    """hypercorn's trio connection, with byok's read timeouts, let go once the client has
    closed it.

    hypercorn's only read timeout (``read_timeout``) limits every read: it would cut a RunSSE,
    whose client sends nothing after its request while the stream runs for minutes. Here a read
    is timed only while the client owes the rest of something it began (``unfinished``), for
    REQUEST_READ_TIMEOUT_S in all.

    hypercorn 0.18 reads the EOF of a keep-alive connection that is idle between requests,
    but its keep-alive timer goes on running, and the connection's task group waits for it:
    the socket and ~13 KB stayed for KEEP_ALIVE_TIMEOUT_S after every connection a client
    closed idle (its pool's own idle expiry). Nothing is read once the reading loop ends, so
    the timer is stopped then. (A connection closed mid-request was always released.)"""

    async def _read_data(self) -> None:
        phase: Phase | None = None
        waited = 0.0
        while True:
            now = unfinished(self.protocol.protocol)
            if now != phase:
                phase, waited = now, 0.0
            limit = math.inf if phase is None else REQUEST_READ_TIMEOUT_S - waited
            started = trio.current_time()
            try:
                with trio.fail_after(max(limit, 0.0)):
                    data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            except trio.TooSlowError:
                what = phase[0] if phase else "request"
                server_log.info("closed a connection: its %s took over %gs", what, REQUEST_READ_TIMEOUT_S)
                break
            waited += trio.current_time() - started
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())
        await self.idle_task.stop()


class CheckedFrameBuffer(FrameBuffer):
    """h2's frame buffer (server side), answering a broken preface with GOAWAY at once.

    h2 checks a frame's length only once all of it has arrived and accepts any first frame, so
    a preface followed by garbage (read as a frame header announcing megabytes) left the
    connection waiting for data that never comes. The first frame must be the client's
    SETTINGS (RFC 9113 §3.4) and no frame may announce more than the negotiated size: both are
    checked on the 9-byte header, and h2 then queues a GOAWAY, hypercorn sends it and closes.
    (h2 4.x's FrameBuffer internals: tests/integration/test_hardening_requests.py fails loudly
    on an h2 that changes them.)"""

    def __init__(self) -> None:
        super().__init__(server=True)
        self.frames = 0  # moves on as frames are parsed (read timing starts over)
        self._settings_seen = False
        self._invalid: str | None = None

    @property
    def partial(self) -> bool:
        """Part of the preface or of a frame, or a header block awaiting CONTINUATIONs, is held."""
        return bool(self._preamble_len or self._data or self._headers_buffer)

    def add_data(self, data: Any) -> None:
        try:
            super().add_data(data)
        except ProtocolError as e:  # a bad preface: raised from __next__, where h2 sends GOAWAY
            self._invalid = str(e)

    def __next__(self) -> Frame:
        if self._invalid is not None:
            raise ProtocolError(self._invalid)
        if not self._preamble_len and not self._settings_seen and self._data:
            # The first frame's header is checked byte by byte as it comes.
            head = bytes(self._data[:9])
            if (
                (len(head) >= 3 and int.from_bytes(head[:3], "big") % 6)  # 6 bytes a setting
                or (len(head) >= 4 and head[3] != _SETTINGS)
                or (len(head) >= 5 and head[4] & _ACK)
                or any(head[5:9])  # stream 0
            ):
                raise ProtocolError("the connection preface does not end with a SETTINGS frame")
            self._settings_seen = len(head) == 9
        if len(self._data) >= 9:
            self._validate_frame_length(int.from_bytes(self._data[:3], "big"))
        frame = super().__next__()
        self.frames += 1
        return frame


_SETTINGS = 0x4  # frame type
_ACK = 0x1  # SETTINGS flag


class CheckedH2Protocol(H2Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection.incoming_buffer = CheckedFrameBuffer()


# The classes hypercorn's trio worker makes each connection and its HTTP/2 protocol with
# (module globals it looks up).
hypercorn.trio.run.TCPServer = ReleasingTCPServer  # type: ignore[misc]
hypercorn.protocol.H2Protocol = CheckedH2Protocol  # type: ignore[misc]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only: 127.0.0.0/8, ::1 (IPv4-mapped too), localhost."""
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name.rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _bind_address(host: str, port: int) -> str:
    # hypercorn parses "host:port" with rsplit(":"); IPv6 literals need brackets.
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class _TLSConfig(HypercornConfig):
    """hypercorn's config serving TLS from a context byok built (a CA-issued leaf that renews
    itself, or the user's certificate), not from certificate files."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        return True

    def create_ssl_context(self) -> ssl.SSLContext:
        return self._context


def server_config(host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> HypercornConfig:
    config = HypercornConfig() if ssl_context is None else _TLSConfig(ssl_context)
    config.bind = [_bind_address(host, port)]
    # Requests are logged by the app (the forwarder logs method/path/status/duration); the
    # access log would only duplicate them. Server errors go through normal logging.
    config.accesslog = None
    config.errorlog = server_log
    # Forwarded responses carry upstream's own Server header; don't add a second one.
    config.include_server_header = False
    # Agent streams stay open for minutes with long quiet gaps: no per-read timeout. The reads
    # of a request a client has begun are timed by ReleasingTCPServer instead.
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
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[str, Callable[[], None]]:
    """Start serving ``app`` on ``host:port`` (``port=0``: any free port) in ``nursery``.

    Returns once the socket is listening, with the base URL actually bound (e.g.
    ``http://127.0.0.1:54321``) and a function that starts a graceful shutdown: stop
    accepting, let in-flight requests run for up to ``graceful_timeout``, then cancel them.
    The server task then ends and the nursery can exit. Binding errors (port in use) raise
    here. HTTP/1.1 is always served; ``h2c`` also allows cleartext HTTP/2, which Cursor
    uses for bidirectional streams. With ``ssl_context`` the listener speaks TLS only (HTTP/2
    by ALPN), and the URL is ``https://``.

    ``app`` must either implement the ASGI lifespan protocol or raise on a lifespan scope:
    hypercorn fails to start if the lifespan call simply returns.
    """
    config = server_config(host, port, ssl_context)
    shutdown = trio.Event()
    served = app if h2c else _http1_only(app)
    binds: list[str] = await nursery.start(
        partial(hypercorn.trio.serve, served, config, shutdown_trigger=shutdown.wait, mode="asgi")
    )
    return binds[0], shutdown.set
