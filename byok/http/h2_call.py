"""One full-duplex HTTP/2 request: its body goes up while its response comes down.

httpx (httpcore) writes a request's whole body before it reads the response, so a Connect bidi
call (``agent.v1.AgentService/Run``, where the client answers what the server streams) cannot go
through it. This speaks h2 over a trio stream: one connection per call (a Run lasts a turn),
TLS with ALPN ``h2`` for ``https://``, prior knowledge (h2c) for ``http://``. Flow control both
ways: a chunk is acknowledged to the server once the caller has taken it, and the body waits for
the server's window.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import httpx
import trio

from byok.http.clients import keepalive_options

CONNECT_TIMEOUT_S = 10.0
_RECV = 65536
# How much of the response the server may send ahead of what the caller has taken.
_WINDOW = 4 * 1024 * 1024


class H2Error(Exception):
    """The server or the connection failed the call; the message says how, in one line."""


Headers = list[tuple[bytes, bytes]]


@asynccontextmanager
async def h2_call(
    url: httpx.URL, headers: Headers, *, method: str = "POST", ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[H2Call]:
    """A call, connected and its headers sent, read as the server answers until the block ends;
    then the stream is reset (unless it ended) and the connection closed. Connecting raises
    H2Error, OSError or trio.TooSlowError."""
    call = await H2Call.open(url, headers, method=method, ssl_context=ssl_context)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.read)
            yield call
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await call.close()


class H2Call:
    """``send``/``end`` the request body, ``response()`` for the status and headers, ``body()``
    for the response's chunks; ``read`` must run meanwhile (``h2_call`` runs it)."""

    def __init__(self, stream: trio.abc.Stream, conn: h2.connection.H2Connection, stream_id: int) -> None:
        self._stream = stream
        self._conn = conn
        self._id = stream_id
        self._write = trio.Lock()
        self._window = trio.Event()  # replaced each time the server's window may have grown
        self._head = trio.Event()
        self.status = 0
        self.headers: Headers = []
        self._chunks_in, self._chunks = trio.open_memory_channel[bytes | H2Error | None](math.inf)
        self._failure: H2Error | None = None
        self._done = False  # the response ended (or failed)

    @classmethod
    async def open(
        cls,
        url: httpx.URL,
        headers: Headers,
        *,
        method: str = "POST",
        ssl_context: ssl.SSLContext | None = None,
    ) -> H2Call:
        """Connect and send the request's headers. Raises H2Error (or OSError, TooSlowError)."""
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        with trio.fail_after(CONNECT_TIMEOUT_S):
            tcp = await trio.open_tcp_stream(host, port)
            for level, option, value in keepalive_options():
                tcp.setsockopt(level, option, value)
            stream: trio.abc.Stream = tcp
            if url.scheme == "https":
                context = ssl_context or httpx.create_ssl_context()
                context.set_alpn_protocols(["h2"])
                tls = trio.SSLStream(tcp, context, server_hostname=host, https_compatible=True)
                try:
                    await tls.do_handshake()
                except (trio.BrokenResourceError, ssl.SSLError) as e:
                    await tcp.aclose()
                    raise H2Error(f"TLS handshake with {host}:{port} failed: {e.__cause__ or e}") from None
                if tls.selected_alpn_protocol() != "h2":
                    await tls.aclose()
                    raise H2Error(f"{host}:{port} does not speak HTTP/2")
                stream = tls
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None, validate_inbound_headers=False)
        )
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW})
        conn.increment_flow_control_window(_WINDOW)
        stream_id = conn.get_next_available_stream_id()
        authority = host if port == (443 if url.scheme == "https" else 80) else f"{host}:{port}"
        pseudo = [
            (b":method", method.encode()),
            (b":scheme", url.scheme.encode()),
            (b":authority", authority.encode()),
            (b":path", url.raw_path),
        ]
        conn.send_headers(stream_id, pseudo + headers)
        call = cls(stream, conn, stream_id)
        await call._flush()
        return call

    # --- request body -------------------------------------------------------------------
    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._raise_if_failed()
            room = min(self._conn.local_flow_control_window(self._id), self._conn.max_outbound_frame_size)
            if room <= 0:
                await self._window.wait()
                continue
            self._conn.send_data(self._id, bytes(view[:room]))
            view = view[room:]
            await self._flush()

    async def end(self) -> None:
        self._raise_if_failed()
        self._conn.end_stream(self._id)
        await self._flush()

    # --- response -----------------------------------------------------------------------
    async def response(self) -> tuple[int, Headers]:
        await self._head.wait()
        self._raise_if_failed()
        return self.status, self.headers

    async def body(self) -> AsyncIterator[bytes]:
        """The response body's chunks as they come; raises H2Error if it breaks off."""
        while True:
            item = await self._chunks.receive()
            if item is None:
                return
            if isinstance(item, H2Error):
                raise item
            yield item
            if not self._done:  # the server may send as much again
                self._conn.acknowledge_received_data(len(item), self._id)
                await self._flush()

    # --- the connection -------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _fail(self, why: str) -> None:
        if self._failure is None:
            self._failure = H2Error(why)
        self._head.set()
        self._window.set()
        if not self._done:
            self._done = True
            self._chunks_in.send_nowait(self._failure)

    async def _flush(self) -> None:
        async with self._write:
            data = self._conn.data_to_send()
            if data:
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                    self._fail(f"connection lost: {e}")
                    assert self._failure is not None
                    raise self._failure from None

    async def read(self) -> None:
        """Take in what the server sends until the response ends or fails."""
        while not self._done:
            try:
                data = await self._stream.receive_some(_RECV)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                self._fail(f"connection lost: {e}")
                return
            if not data:
                self._fail("the server closed the connection before the response ended")
                return
            try:
                events = self._conn.receive_data(data)
            except h2.exceptions.ProtocolError as e:
                self._fail(f"HTTP/2 protocol error: {e}")
                return
            for event in events:
                self._on(event)
            try:
                await self._flush()  # SETTINGS and PING acknowledgements, window updates
            except H2Error:
                return

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived) and event.stream_id == self._id:
            headers = [(bytes(k), bytes(v)) for k, v in event.headers or ()]
            status = next((v for k, v in headers if k == b":status"), b"0")
            self.status = int(status) if status.isdigit() else 0
            self.headers = [(k, v) for k, v in headers if not k.startswith(b":")]
            self._head.set()
        elif isinstance(event, h2.events.DataReceived) and event.stream_id == self._id:
            if event.data:
                self._chunks_in.send_nowait(bytes(event.data))
            # Padding counts against the window but never reaches the caller.
            padding = (event.flow_controlled_length or 0) - len(event.data or b"")
            if padding > 0:
                self._conn.acknowledge_received_data(padding, self._id)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id == self._id:
            self._done = True
            self._head.set()
            self._chunks_in.send_nowait(None)
        elif isinstance(event, h2.events.StreamReset) and event.stream_id == self._id:
            self._fail(f"the server reset the stream ({_code(event.error_code)})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._fail(f"the server ended the connection ({_code(event.error_code)})")
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._window.set()
            self._window = trio.Event()

    async def close(self) -> None:
        try:
            if not self._done:
                self._conn.reset_stream(self._id, h2.errors.ErrorCodes.CANCEL)
            self._conn.close_connection()
            with trio.move_on_after(1):
                await self._flush()
        except (H2Error, h2.exceptions.ProtocolError):
            pass
        await self._stream.aclose()


def _code(code: int | None) -> str:
    try:
        return h2.errors.ErrorCodes(code or 0).name
    except ValueError:
        return str(code)
