"""Streaming reverse proxy to Cursor's real backend, for every route byok does not answer.

Bytes pass through untouched in both directions: no decompression, no re-chunking beyond
what the transports do, status codes (including 4xx/5xx) as upstream sent them. Only the
hop-by-hop headers that describe one TCP connection are dropped.

Only an origin-form target (``/path?query``) is relayed, and only to the configured upstream
(or the proxied host): anything else is a 400 before any connection is made.

Limitation: the upstream leg is httpx over HTTP/1.1, and httpcore writes the whole request
body before it reads the response. Each direction streams without buffering, but a request
never sees response bytes while its own body is still being sent (no full-duplex). The one
route that needs both at once, a relayed HTTP/2 Run, goes through bidi_relay.py instead.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import AsyncIterator
from urllib.parse import quote

import attrs
import httpx
import trio

from byok.http.asgi import respond_connect_error
from byok.http.connect_envelope import ConnectError, end_stream_error, unary_error_body
from byok.http.proxy import upstream_for
from byok.http.serve import Receive, Scope, Send

# RFC 9110 §7.6.1 connection-specific fields, plus Host (httpx derives it from the upstream
# URL) and a few that only make sense between client and byok.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"http2-settings",  # h2c upgrade parameter, consumed by our server
    }
)
# hypercorn already answered any "Expect: 100-continue" towards the client.
_REQUEST_ONLY_DROP = frozenset({b"expect"})
# The ASGI server writes its own Date; Alt-Svc would advertise upstream's endpoints as ours.
_RESPONSE_ONLY_DROP = frozenset({b"date", b"alt-svc"})

_log = logging.getLogger("byok.http")


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names listed in ``Connection:`` are hop-by-hop too (RFC 9110 §7.6.1)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def filter_headers(
    headers: list[tuple[bytes, bytes]], *, drop: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """End-to-end headers only, original order and case of values kept. Pure, for tests."""
    listed = _connection_tokens(headers)
    out = []
    for name, value in headers:
        lname = name.lower()
        if (
            lname in _HOP_BY_HOP
            or lname in listed
            or lname in drop
            or lname.startswith(b"proxy-")
            or lname.startswith(b":")
        ):
            continue
        out.append((lname, value))
    return out


class BadTarget(ValueError):
    """A request target byok will not relay; the message is the client's one-line reason."""


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# For the decoded path, when a server gives no raw_path: only what is data in a path stays.
_PATH_KEEP = "/:@!$&'()*+,;=~"


def origin_form(scope: Scope) -> tuple[str, str]:
    """The request target's path and query as sent; BadTarget unless it is origin-form
    (``/path[?query]``, RFC 9112 §3.2.1).

    Whatever else a client sends would reach the upstream URL as text: ``@host/x`` and
    ``#@host/x`` make upstream's host userinfo or a fragment and name another host, while
    ``http://...``, ``:9/x`` and ``.example/x`` end up in the port."""
    raw = scope.get("raw_path")
    try:
        path = raw.decode("ascii") if raw else quote(scope.get("path", ""), safe=_PATH_KEEP)
        query = bytes(scope.get("query_string", b"")).decode("ascii")
    except UnicodeDecodeError:
        raise BadTarget("non-ASCII request target") from None
    shown = path[:80] + ("..." if len(path) > 80 else "")
    if scope.get("method") == "CONNECT":
        raise BadTarget("CONNECT is not served here (byok's HTTPS proxy is its own listener, serve --proxy)")
    if path == "*":
        raise BadTarget("asterisk-form request target (*) is not served")
    if _SCHEME.match(path):
        raise BadTarget(f"absolute-form request target {shown!r}: byok is no proxy here, send the path alone")
    if not path.startswith("/"):
        raise BadTarget(f"request target must be a path starting with '/', got {shown!r}")
    if "#" in path or "#" in query:
        raise BadTarget(f"request target {shown!r} carries a fragment ('#')")
    return path, query


@functools.lru_cache(maxsize=64)  # keys: the configured upstream, intercepted origins
def _origin(base: str) -> httpx.URL:
    url = httpx.URL(base)
    if url.scheme not in ("http", "https") or not url.host or url.userinfo or url.query or url.fragment:
        raise ValueError(f"upstream must be http(s)://host[:port][/prefix], got {base!r}")
    return url


def upstream_url(base: str, scope: Scope) -> httpx.URL:
    """``base``'s scheme, host and port (never the client's), with the request's path and query.

    Built from components, never by pasting text. Path and query are the client's raw bytes:
    ``//x`` stays ``//x`` and percent-escapes stay as sent; httpx only escapes what a URL
    cannot hold (``{``, ``"``, ...) and drops ``.``/``..`` segments. Raises BadTarget for a
    target that is not origin-form."""
    path, query = origin_form(scope)
    origin = _origin(base)
    prefix = origin.raw_path.decode("ascii").rstrip("/")
    try:
        return origin.copy_with(path=prefix + path, query=query.encode("ascii") if query else None)
    except httpx.InvalidURL as e:
        raise BadTarget(f"request target not relayable: {e}") from None


async def refused_target(scope: Scope, send: Send) -> bool:
    """Answer 400 to a request whose target is not origin-form, before anything else sees it."""
    try:
        origin_form(scope)
    except BadTarget as e:
        _log.info("refused %s: %s", scope.get("method"), e)
        await respond_connect_error(send, ConnectError("invalid_argument", str(e)))
        return True
    return False


class _ClientGone(Exception):
    """The client disconnected while we were still reading its request body."""


class _RequestBody:
    """The ASGI request body as an async byte source; ``done`` is set once fully read."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.done = trio.Event()

    async def read(self) -> tuple[bytes, bool]:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        more = bool(message.get("more_body", False))
        if not more:
            self.done.set()
        return bytes(message.get("body", b"")), more

    async def stream(self, first: bytes) -> AsyncIterator[bytes]:
        if first:
            yield first
        more = True
        while more:
            chunk, more = await self.read()
            if chunk:
                yield chunk


@attrs.define
class _Outcome:
    """What happened to one forward, filled in as it progresses, for the log line."""

    status: int = 499  # nginx's "client closed request": nothing was ever sent
    note: str = ""
    upstream_fault: bool = False  # worth a warning; a client hanging up is routine
    # Set before the last body message: hypercorn reports http.disconnect as soon as a
    # response is complete, which must not read as the client hanging up.
    complete: bool = False


async def _serve_lifespan(receive: Receive, send: Send) -> None:
    # Lets a bare Forwarder be served directly (tests, `byok` with no local routes)
    # without hypercorn logging a lifespan failure at startup.
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# Connect's HTTP status -> code mapping, for upstream errors surfaced inside a stream.
_CONNECT_CODE_FOR_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "unimplemented",
    408: "deadline_exceeded",
    429: "unavailable",
    499: "canceled",
    501: "unimplemented",
    503: "unavailable",
    504: "deadline_exceeded",
}


class Forwarder:
    """ASGI app that relays a request to ``upstream`` and streams the answer back.

    The caller owns ``client`` and must create it as ``clients.upstream_client`` does: HTTP/1.1,
    a connect timeout only, no redirects followed, idle connections kept 55 s (not httpx's 5 s),
    TCP keepalive probes on every connection.

    No read/write timeout because Connect server streams legitimately go quiet for long
    stretches; redirects are passed to the client rather than followed. Requests are built
    with ``httpx.Request`` directly, so the client's default headers (notably its
    ``Accept-Encoding``, which would make upstream compress bodies the client never asked
    to be compressed) and cookie jar are not applied.
    """

    def __init__(self, upstream: str, client: httpx.AsyncClient, log: logging.Logger) -> None:
        self._base = upstream.rstrip("/")
        self._client = client
        self._log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"Forwarder serves http scopes only, got {scope['type']!r}")
        started = time.monotonic()
        outcome = _Outcome()
        try:
            await self._forward(scope, receive, send, outcome)
        finally:
            elapsed_ms = (time.monotonic() - started) * 1000
            level = logging.WARNING if outcome.upstream_fault else logging.INFO
            self._log.log(
                level,
                "forward %s %s -> %d in %.0f ms%s",
                scope["method"],
                scope["path"],
                outcome.status,
                elapsed_ms,
                f" ({outcome.note})" if outcome.note else "",
            )

    async def _forward(self, scope: Scope, receive: Receive, send: Send, outcome: _Outcome) -> None:
        try:
            url = upstream_url(upstream_for(scope, self._base), scope)
        except BadTarget as e:
            outcome.status, outcome.note, outcome.complete = 400, str(e), True
            await respond_connect_error(send, ConnectError("invalid_argument", str(e)))
            return
        body = _RequestBody(receive)
        try:
            first, more = await body.read()
        except _ClientGone:
            outcome.note = "client disconnected"
            return
        # A body that arrived whole is sent with an exact Content-Length (httpx computes it);
        # otherwise it streams, keeping the client's Content-Length if it declared one so
        # upstream sees the same framing, else chunked.
        headers = filter_headers(
            scope["headers"],
            drop=_REQUEST_ONLY_DROP if more else _REQUEST_ONLY_DROP | {b"content-length"},
        )
        request = httpx.Request(
            scope["method"],
            url,
            headers=headers,
            content=body.stream(first) if more else first,
        )
        async with trio.open_nursery() as nursery:
            # Once the body is read, the only thing receive() can still report is the
            # client going away; that must stop an endless upstream stream too.
            nursery.start_soon(_cancel_on_disconnect, body, receive, nursery.cancel_scope, outcome)
            await self._exchange(request, send, outcome)
            nursery.cancel_scope.cancel()

    async def _exchange(self, request: httpx.Request, send: Send, outcome: _Outcome) -> None:
        try:
            response = await self._client.send(request, stream=True)
        except _ClientGone:
            outcome.note = "client disconnected"
            return
        except httpx.TransportError as exc:
            await self._unreachable(send, exc, outcome)
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    # Content-Length stays: raw bytes pass unchanged, so it remains exact.
                    "headers": filter_headers(response.headers.raw, drop=_RESPONSE_ONLY_DROP),
                }
            )
            outcome.status = response.status_code
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.TransportError as exc:
                # Returning without the final body message makes the server abort the
                # connection, so the client sees a truncated stream, not a clean end.
                outcome.note = f"upstream failed mid-body: {_describe(exc)}"
                outcome.upstream_fault = True
                return
            outcome.complete = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()

    async def relay_stream_body(self, scope: Scope, body: bytes, send: Send) -> None:
        """Relay a server-streaming call whose response headers were already sent to the client
        (RunSSE answers its headers before the run_request decides local vs upstream). Upstream's
        body is piped decoded; an upstream failure becomes a Connect end-stream error, the only
        way a stream whose status is already 200 can still report one."""
        headers = filter_headers(scope["headers"], drop=_REQUEST_ONLY_DROP | {b"content-length"})
        try:
            url = upstream_url(upstream_for(scope, self._base), scope)
        except BadTarget as e:  # App refuses these before routing; a bare caller may not
            err = ConnectError("invalid_argument", str(e))
            await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
            return
        request = httpx.Request(scope["method"], url, headers=headers, content=body)
        started = time.monotonic()
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            err = ConnectError("unavailable", f"upstream unreachable: {_describe(exc)}")
            await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
            self._log.warning("relay %s -> unreachable (%s)", scope["path"], _describe(exc))
            return
        try:
            if response.status_code != 200:
                detail = (await response.aread())[:2000].decode("utf-8", "replace")
                code = _CONNECT_CODE_FOR_STATUS.get(response.status_code, "unavailable")
                err = ConnectError(code, f"upstream answered HTTP {response.status_code}: {detail}")
                await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
                return
            try:
                async for chunk in response.aiter_bytes():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.TransportError as exc:
                self._log.warning("relay %s: upstream failed mid-stream: %s", scope["path"], _describe(exc))
                return  # the client sees a truncated stream, as it would from upstream itself
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()
            self._log.info(
                "relay %s -> %d in %.0f ms",
                scope["path"],
                response.status_code,
                (time.monotonic() - started) * 1000,
            )

    async def _unreachable(self, send: Send, exc: httpx.TransportError, outcome: _Outcome) -> None:
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            message = f"upstream unreachable: {_describe(exc)}"
        else:
            message = f"upstream failed before responding: {_describe(exc)}"
        body = unary_error_body(ConnectError("unavailable", message))
        outcome.status = 502
        outcome.note = message
        outcome.upstream_fault = True
        await send(
            {
                "type": "http.response.start",
                "status": 502,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        outcome.complete = True
        await send({"type": "http.response.body", "body": body})


def _describe(exc: BaseException) -> str:
    # Some httpx errors (timeouts) have an empty message; the class name still says it all.
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _cancel_on_disconnect(
    body: _RequestBody, receive: Receive, scope: trio.CancelScope, outcome: _Outcome
) -> None:
    await body.done.wait()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not outcome.complete:
                outcome.note = "client disconnected"
                scope.cancel()
            return
