"""HTTPS proxy mode: an HTTP CONNECT proxy that hands Cursor's backend traffic to byok's app.

Cursor (``"http.proxy": "http://127.0.0.1:8791"``) opens ``CONNECT host:443`` tunnels here.

- ``host`` matches the intercept list (fnmatch patterns, default ``*.cursor.sh``): byok answers
  the CONNECT itself, never resolving or contacting ``host``, terminates TLS with a leaf
  certificate from byok's local CA (``byok.http.ca``), and serves the decrypted connection with
  hypercorn's protocol stack and the same ASGI app as the plain listener. ALPN offers ``h2`` and
  ``http/1.1``, so both HTTP versions work. Each request's scope carries the tunnel's origin
  (``https://host[:port]``) under ``scope["extensions"]["byok.upstream"]``; routes byok does not
  answer must be relayed there (``upstream_for``), with TLS verification on as usual.
- any other host: a blind TCP tunnel, bytes untouched in both directions.

Plain-HTTP proxy requests (absolute-form ``GET http://...``) are refused with 405: Cursor's
backend is HTTPS only. The listener is an open relay to whatever it can reach, so keep it on
loopback (the default); a warning is logged otherwise.

Serving a decrypted connection uses hypercorn's per-connection server
(``hypercorn.trio.tcp_server.TCPServer``, as byok's ``ReleasingTCPServer``), which is not public
API: tests/integration/test_proxy.py covers it for HTTP/1.1 and HTTP/2, so a hypercorn upgrade
that changes it fails loudly.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import logging
import re
import ssl
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import trio
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from byok.http.ca import LocalCA
from byok.http.lan import Credential
from byok.http.serve import ASGIApp, Receive, ReleasingTCPServer, Scope, Send, server_config

log = logging.getLogger("byok.proxy")

UPSTREAM_EXTENSION = "byok.upstream"
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
GRACE_S = 5.0
_RECV = 65536
_HOSTNAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")


def upstream_for(scope: Scope, default: str) -> str:
    """The origin a relayed request should go to: the proxied host's, else ``default``."""
    ext = scope.get("extensions") or {}
    value = ext.get(UPSTREAM_EXTENSION)
    return value if isinstance(value, str) and value else default


def intercepts(host: str, patterns: Sequence[str]) -> bool:
    """Whether ``host`` matches one of the (case-insensitive, fnmatch) patterns."""
    name = host.lower().rstrip(".")
    return any(fnmatch.fnmatchcase(name, p.lower().rstrip(".")) for p in patterns)


class BadRequest(Exception):
    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason


def parse_authority(target: str) -> tuple[str, int]:
    """``host:port`` of a CONNECT request target; IPv6 literals in brackets."""
    if target.startswith("["):
        host, sep, rest = target[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise BadRequest(400, "Bad Request", f"bad CONNECT target {target!r}")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise BadRequest(400, "Bad Request", f"bad IPv6 literal in {target!r}") from None
    else:
        host, sep, port_text = target.rpartition(":")
        if not sep or not host or ":" in host:
            raise BadRequest(400, "Bad Request", f"CONNECT target needs host:port, got {target!r}")
        # An intercepted host becomes the origin relayed requests go to, and fnmatch's ``*``
        # matches anything: ``evil.example/x.cursor.sh`` or ``evil.example?.cursor.sh`` would
        # send them to evil.example. Only a DNS name or an IPv4 address is a host.
        if not _HOSTNAME.fullmatch(host):
            raise BadRequest(400, "Bad Request", f"bad host in CONNECT target {target!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadRequest(400, "Bad Request", f"bad port in {target!r}")
    return host, int(port_text)


def parse_head(head: bytes) -> tuple[str, str]:
    """(method, target) of a proxy request head (request line and headers, CRLF CRLF excluded)."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(400, "Bad Request", "malformed request line")
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "Bad Request", "non-ASCII request line") from None
    return method, target


def _status(status: int, reason: str, body: str = "") -> bytes:
    data = body.encode()
    head = f"HTTP/1.1 {status} {reason}\r\n"
    if status == 407:
        head += 'Proxy-Authenticate: Basic realm="byok"\r\n'
    if status != 200:
        head += (
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(data)}\r\nConnection: close\r\n"
        )
    return head.encode() + b"\r\n" + data


class _Prefixed(trio.abc.Stream):
    """A stream that first yields bytes already read past the CONNECT head."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix

    @property
    def socket(self) -> Any:  # hypercorn reads the peer address from transport_stream.socket
        stream: Any = self.inner
        while not hasattr(stream, "socket"):  # the proxy's own TLS (LAN mode) wraps the socket
            stream = stream.transport_stream
        return stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            n = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:n], self._prefix[n:]
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _with_upstream(app: ASGIApp, origin: str) -> ASGIApp:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = dict(scope)
            scope["extensions"] = {**(scope.get("extensions") or {}), UPSTREAM_EXTENSION: origin}
        await app(scope, receive, send)

    return wrapped


class ProxyServer:
    """``tls``: the listener's own TLS (an HTTPS proxy, LAN mode); ``credential``: what every
    CONNECT's ``Proxy-Authorization`` must carry (407 otherwise)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        intercept: Sequence[str],
        ca: LocalCA,
        http2: bool = True,
        tls: ssl.SSLContext | None = None,
        credential: Credential | None = None,
    ) -> None:
        self.app = app
        self.intercept = tuple(intercept)
        self.ca = ca
        self.alpn = ("h2", "http/1.1") if http2 else ("http/1.1",)
        self.config = server_config("127.0.0.1", 0)
        self.context = WorkerContext(None)
        self.tls = tls
        self.credential = credential

    async def serve(self, conn: trio.SocketStream) -> None:
        """One client connection; a failure ends that connection only, never the listener."""
        try:
            await self.handle(conn)
        except Exception:
            log.exception("proxy connection failed")
            with trio.CancelScope(shield=True):
                await conn.aclose()

    async def handle(self, conn: trio.SocketStream) -> None:
        # ``outer``: what the client's CONNECT came over (the proxy's own TLS, or the socket).
        outer: trio.abc.Stream = conn
        try:
            with trio.fail_after(HEAD_TIMEOUT_S):
                if self.tls is not None:
                    outer = trio.SSLStream(conn, self.tls, server_side=True, https_compatible=True)
                    await outer.do_handshake()
                head, rest = await _read_head(outer)
            method, target = parse_head(head)
            if method != "CONNECT":
                raise BadRequest(405, "Method Not Allowed", "byok's proxy only tunnels HTTPS (CONNECT)\n")
            host, port = parse_authority(target)
            if self.credential is not None and not self.credential.proxy_ok(
                _header(head, b"proxy-authorization")
            ):
                log.warning("proxy CONNECT %s:%d refused: no credential", host, port)
                raise BadRequest(407, "Proxy Authentication Required", "this proxy needs its credential\n")
        except BadRequest as e:
            await _reply(outer, _status(e.status, e.reason, str(e)))
            await outer.aclose()
            return
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            await conn.aclose()
            return
        stream: trio.abc.Stream = _Prefixed(outer, rest) if rest or outer is not conn else conn
        if intercepts(host, self.intercept):
            await self._intercept(outer, stream, host, port)
        else:
            await self._tunnel(outer, stream, host, port)

    async def _intercept(self, conn: trio.abc.Stream, stream: trio.abc.Stream, host: str, port: int) -> None:
        log.debug("proxy CONNECT %s:%d: intercepted", host, port)
        if not await _reply(conn, _status(200, "Connection Established")):
            return
        tls = trio.SSLStream(
            stream, self.ca.server_context(host, alpn=self.alpn), server_side=True, https_compatible=True
        )
        shown = f"[{host}]" if ":" in host else host
        origin = f"https://{shown}" if port == 443 else f"https://{shown}:{port}"
        app = wrap_app(_with_upstream(self.app, origin), self.config.wsgi_max_body_size, "asgi")
        try:
            # Does the TLS handshake (a client that does not trust byok's CA fails here), then
            # HTTP/1.1 or HTTP/2 as ALPN chose.
            await ReleasingTCPServer(app, self.config, self.context, ConnectionState({}), tls).run()  # type: ignore[arg-type]
        finally:
            # TCPServer returns without closing when the handshake fails.
            with trio.CancelScope(shield=True):
                await conn.aclose()

    async def _tunnel(self, conn: trio.abc.Stream, stream: trio.abc.Stream, host: str, port: int) -> None:
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                remote = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as e:
            log.info("proxy CONNECT %s:%d: cannot connect: %s", host, port, e or type(e).__name__)
            timeout = isinstance(e, trio.TooSlowError)
            await _reply(
                conn,
                _status(504, "Gateway Timeout") if timeout else _status(502, "Bad Gateway", f"{e}\n"),
            )
            await conn.aclose()
            return
        log.debug("proxy CONNECT %s:%d: tunnelled", host, port)
        async with remote, stream:
            if not await _reply(conn, _status(200, "Connection Established")):
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, stream, remote, nursery.cancel_scope)
                nursery.start_soon(_pump, remote, stream, nursery.cancel_scope)


async def _read_head(conn: trio.abc.ReceiveStream) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD_BYTES:
            raise BadRequest(431, "Request Header Fields Too Large", "request head too large\n")
        chunk = await conn.receive_some(4096)
        if not chunk:
            raise trio.BrokenResourceError("client closed before sending a request")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _header(head: bytes, name: bytes) -> bytes | None:
    """A header's value in a request head (the request line and headers, CRLF-separated)."""
    for line in head.split(b"\r\n")[1:]:
        key, colon, value = line.partition(b":")
        if colon and key.strip().lower() == name:
            return value.strip()
    return None


async def _reply(conn: trio.abc.Stream, data: bytes) -> bool:
    try:
        await conn.send_all(data)
        return True
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False


async def _pump(src: trio.abc.Stream, dst: trio.abc.Stream, scope: trio.CancelScope) -> None:
    """Copy until EOF, then half-close ``dst``; any failure ends the whole tunnel."""
    try:
        while data := await src.receive_some(_RECV):
            await dst.send_all(data)
        await dst.send_eof()  # type: ignore[attr-defined]
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        scope.cancel()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def serve_proxy(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    intercept: Sequence[str],
    ca: LocalCA,
    nursery: trio.Nursery,
    http2: bool = True,
    tls: ssl.SSLContext | None = None,
    credential: Credential | None = None,
) -> tuple[str, Callable[[], None]]:
    """Start the CONNECT proxy on ``host:port`` (0: any free port) in ``nursery``.

    Returns once listening, with the proxy URL (``http://host:port``) and a function that starts
    shutdown: stop accepting, give open connections ``GRACE_S`` seconds, then cancel them.
    """
    server = ProxyServer(app, intercept=intercept, ca=ca, http2=http2, tls=tls, credential=credential)
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"{'https' if tls is not None else 'http'}://{shown}:{bound[1]}"
    if not _is_loopback(host) and credential is None:
        log.warning("proxy listening on non-loopback %s: anyone who can reach it can tunnel through it", url)
    stop = trio.Event()

    async def run() -> None:
        try:
            async with trio.open_nursery() as conns:
                async with trio.open_nursery() as accept:
                    accept.start_soon(
                        partial(trio.serve_listeners, server.serve, listeners, handler_nursery=conns)
                    )
                    await stop.wait()
                    accept.cancel_scope.cancel()
                await server.context.terminated.set()
                conns.cancel_scope.deadline = trio.current_time() + GRACE_S
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()

    nursery.start_soon(run)
    log.info("byok HTTPS proxy on %s (intercepting %s)", url, ", ".join(intercept) or "nothing")
    return url, stop.set
