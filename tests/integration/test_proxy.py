"""The HTTPS (CONNECT) proxy and byok's local CA, all on loopback."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import ssl
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from byok.http.ca import CA_CERT, CA_KEY, LEAF_DAYS, LocalCA, ca_cert_path
from byok.http.proxy import (
    UPSTREAM_EXTENSION,
    BadRequest,
    intercepts,
    parse_authority,
    parse_head,
    serve_proxy,
    upstream_for,
)
from byok.http.serve import Receive, Scope, Send

# --- CA ------------------------------------------------------------------------------------


def test_ca_generated_once_and_reused(tmp_path: Path) -> None:
    ca = LocalCA.load_or_create(tmp_path)
    ca_dir = tmp_path / "ca"
    assert ca.cert_path == ca_dir / CA_CERT == ca_cert_path(tmp_path)
    assert stat.S_IMODE((ca_dir / CA_KEY).stat().st_mode) == 0o600
    assert stat.S_IMODE(ca_dir.stat().st_mode) == 0o700
    pem, key = (ca_dir / CA_CERT).read_bytes(), (ca_dir / CA_KEY).read_bytes()
    again = LocalCA.load_or_create(tmp_path)
    assert again.cert_pem == pem == ca.cert_pem
    assert (ca_dir / CA_KEY).read_bytes() == key
    # A key someone made group-readable is tightened again on load.
    (ca_dir / CA_KEY).chmod(0o644)
    LocalCA.load_or_create(tmp_path)
    assert stat.S_IMODE((ca_dir / CA_KEY).stat().st_mode) == 0o600


def test_ca_constraints(tmp_path: Path) -> None:
    cert = LocalCA.load_or_create(tmp_path).cert
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign
    assert cert.subject == cert.issuer
    assert cert.not_valid_after_utc - cert.not_valid_before_utc > dt.timedelta(days=3000)


def test_leaf_certificate(tmp_path: Path) -> None:
    ca = LocalCA.load_or_create(tmp_path)
    leaf = ca.issue_leaf("api2.cursor.sh")
    leaf.verify_directly_issued_by(ca.cert)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["api2.cursor.sh"]
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert dt.timedelta(days=LEAF_DAYS) < lifetime < dt.timedelta(days=398)
    now = dt.datetime.now(dt.UTC)
    assert leaf.not_valid_before_utc < now < leaf.not_valid_after_utc
    ip_leaf = ca.issue_leaf("127.0.0.1")
    ip_san = ip_leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(v) for v in ip_san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    # Server contexts are cached per host.
    assert ca.server_context("api2.cursor.sh") is ca.server_context("API2.cursor.sh.")


# --- pure helpers ---------------------------------------------------------------------------


def test_intercepts() -> None:
    patterns = ["*.cursor.sh", "cursor.com"]
    assert intercepts("api2.cursor.sh", patterns)
    assert intercepts("agentn.api5.cursor.sh", patterns)
    assert intercepts("API2.Cursor.SH.", patterns)
    assert intercepts("cursor.com", patterns)
    assert not intercepts("cursor.sh", patterns)
    assert not intercepts("evilcursor.sh", patterns)
    assert not intercepts("www.cursor.com", patterns)
    assert not intercepts("api2.cursor.sh", [])


def test_parse_authority_and_head() -> None:
    assert parse_authority("api2.cursor.sh:443") == ("api2.cursor.sh", 443)
    assert parse_authority("[::1]:8443") == ("::1", 8443)
    for bad in ("api2.cursor.sh", "host:0", "host:99999", "[::1]", "::1:443", ":443", "[nope]:1"):
        with pytest.raises(BadRequest):
            parse_authority(bad)
    assert parse_head(b"CONNECT a:1 HTTP/1.1\r\nHost: a:1") == ("CONNECT", "a:1")
    with pytest.raises(BadRequest):
        parse_head(b"garbage")
    assert upstream_for({"extensions": {UPSTREAM_EXTENSION: "https://x"}}, "https://d") == "https://x"
    assert upstream_for({}, "https://d") == "https://d"


# --- the proxy -------------------------------------------------------------------------------


async def _lifespan(receive: Receive, send: Send) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Stands in for byok's App: says what it saw."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    info = {
        "path": scope["path"],
        "scheme": scope["scheme"],
        "http_version": scope["http_version"],
        "host": dict(scope["headers"]).get(b"host", b"").decode(),
        "upstream": upstream_for(scope, "default"),
        "body": body.decode(),
    }
    payload = json.dumps(info).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": payload})


@attrs.frozen
class Proxy:
    url: str
    port: int
    ca: LocalCA
    shutdown: object

    def client_ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca.cert_pem.decode())


@asynccontextmanager
async def running_proxy(tmp_path: Path, **kw: object) -> AsyncIterator[Proxy]:
    ca = LocalCA.load_or_create(tmp_path / "data")
    async with trio.open_nursery() as nursery:
        url, shutdown = await serve_proxy(
            echo_app, host="127.0.0.1", port=0, intercept=["*.cursor.sh"], ca=ca, nursery=nursery, **kw
        )
        try:
            with trio.fail_after(20):
                yield Proxy(url, int(url.rsplit(":", 1)[1]), ca, shutdown)
        finally:
            shutdown()


async def test_intercepted_host_reaches_app_http1(tmp_path: Path) -> None:
    async with running_proxy(tmp_path) as p, httpx.AsyncClient(proxy=p.url, verify=p.client_ssl()) as client:
        resp = await client.get("https://api2.cursor.sh/byok/healthz")
        post = await client.post("https://api2.cursor.sh/aiserver.v1.BidiService/BidiAppend", content=b"abc")
        other = await client.get("https://agentn.api5.cursor.sh:8443/x")
    assert resp.status_code == 200
    info = resp.json()
    assert info == {
        "path": "/byok/healthz",
        "scheme": "https",
        "http_version": "1.1",
        "host": "api2.cursor.sh",
        "upstream": "https://api2.cursor.sh",
        "body": "",
    }
    assert post.json()["body"] == "abc"
    assert other.json()["upstream"] == "https://agentn.api5.cursor.sh:8443"


async def test_intercepted_host_http2_via_alpn(tmp_path: Path) -> None:
    async with (
        running_proxy(tmp_path) as p,
        httpx.AsyncClient(proxy=p.url, verify=p.client_ssl(), http2=True) as client,
    ):
        resp = await client.get("https://api2.cursor.sh/byok/healthz")
        again = await client.post("https://api2.cursor.sh/two", content=b"x")
    assert resp.http_version == "HTTP/2"
    assert resp.json()["http_version"] == "2"
    assert again.json()["path"] == "/two"


async def test_http1_only_proxy(tmp_path: Path) -> None:
    async with (
        running_proxy(tmp_path, http2=False) as p,
        httpx.AsyncClient(proxy=p.url, verify=p.client_ssl(), http2=True) as client,
    ):
        resp = await client.get("https://api2.cursor.sh/byok/healthz")
    assert resp.http_version == "HTTP/1.1"


async def test_client_not_trusting_ca_is_refused(tmp_path: Path) -> None:
    async with running_proxy(tmp_path) as p, httpx.AsyncClient(proxy=p.url) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("https://api2.cursor.sh/byok/healthz")
        # The proxy keeps serving after a failed handshake.
        async with httpx.AsyncClient(proxy=p.url, verify=p.client_ssl()) as good:
            assert (await good.get("https://api2.cursor.sh/ok")).status_code == 200


async def _connect(port: int, target: str, extra: bytes = b"") -> tuple[trio.SocketStream, bytes, bytes]:
    """Raw CONNECT: returns (stream, response head, bytes read past it)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode() + extra)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return stream, head, rest


async def _echo_server(nursery: trio.Nursery) -> int:
    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)

    listeners = await nursery.start(trio.serve_tcp, echo, 0)
    return int(listeners[0].socket.getsockname()[1])


async def _read_exactly(stream: trio.abc.ReceiveStream, n: int, first: bytes = b"") -> bytes:
    got = first
    while len(got) < n:
        chunk = await stream.receive_some(65536)
        assert chunk, "stream ended early"
        got += chunk
    return got


async def test_blind_tunnel_bytes_unchanged(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 400
    async with running_proxy(tmp_path) as p, trio.open_nursery() as nursery:
        echo_port = await _echo_server(nursery)
        stream, head, rest = await _connect(p.port, f"127.0.0.1:{echo_port}")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert rest == b""
        async with stream:
            await stream.send_all(payload)
            assert await _read_exactly(stream, len(payload)) == payload
            # Half-close travels through: the echo server sees EOF and closes its side.
            await stream.send_eof()
            assert await stream.receive_some(10) == b""
        # Bytes sent right behind the CONNECT head (before the 200) are not lost.
        stream, head, rest = await _connect(p.port, f"127.0.0.1:{echo_port}", extra=b"early!")
        async with stream:
            assert head.startswith(b"HTTP/1.1 200 ")
            assert await _read_exactly(stream, 6, rest) == b"early!"
        nursery.cancel_scope.cancel()


async def test_blind_tunnel_to_tls_server_keeps_its_certificate(tmp_path: Path) -> None:
    # Another CA (not byok's) signs the TLS server's certificate; the client trusts only that CA.
    other_ca = LocalCA.load_or_create(tmp_path / "other")
    server_ctx = other_ca.server_context("127.0.0.1", alpn=("http/1.1",))

    async def tls_server(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, server_ctx, server_side=True)
        async with tls:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += await tls.receive_some(4096)
            await tls.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nfrom the tls"
            )

    async with running_proxy(tmp_path) as p, trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, tls_server, 0)
        port = listeners[0].socket.getsockname()[1]
        trust_other = ssl.create_default_context(cadata=other_ca.cert_pem.decode())
        async with httpx.AsyncClient(proxy=p.url, verify=trust_other) as client:
            resp = await client.get(f"https://127.0.0.1:{port}/")
        assert resp.text == "from the tls"
        # Trusting byok's CA instead fails: byok did not touch that connection.
        async with httpx.AsyncClient(proxy=p.url, verify=p.client_ssl()) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"https://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()


async def test_bad_requests(tmp_path: Path) -> None:
    async with running_proxy(tmp_path) as p:
        stream = await trio.open_tcp_stream("127.0.0.1", p.port)
        await stream.send_all(b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n")
        assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 405 ")
        await stream.aclose()

        stream, head, _ = await _connect(p.port, "no-port-here")
        assert head.startswith(b"HTTP/1.1 400 ")
        await stream.aclose()

        stream, head, _ = await _connect(p.port, "127.0.0.1:9")  # nothing listens on port 9
        assert head.startswith(b"HTTP/1.1 502 ")
        await stream.aclose()


async def test_shutdown_stops_listening(tmp_path: Path) -> None:
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url, shutdown = await serve_proxy(
                echo_app, host="127.0.0.1", port=0, intercept=["*.cursor.sh"], ca=ca, nursery=nursery
            )
            port = int(url.rsplit(":", 1)[1])
            assert url == f"http://127.0.0.1:{port}"
            shutdown()
        # The nursery exited: the proxy task ended.
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)


async def test_an_intercepted_connection_the_client_closed_is_released_at_once(tmp_path: Path) -> None:
    """As on the plain listener (test_server_connections.py): an intercepted keep-alive connection
    the client closes while idle goes at once, not after keep_alive_timeout (300 s)."""

    def sockets() -> set[str]:
        held = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if (target := os.readlink(f"/proc/self/fd/{fd}")).startswith("socket:"):
                    held.add(target)
        return held

    async with running_proxy(tmp_path) as p:
        before = sockets()
        async with httpx.AsyncClient(proxy=p.url, verify=p.client_ssl()) as client:
            for _ in range(3):
                assert (await client.get("https://api2.cursor.sh/byok/healthz")).status_code == 200
            await trio.testing.wait_all_tasks_blocked(0.01)  # the connection idles in both pools
        with trio.fail_after(5):
            while sockets() - before:
                await trio.sleep(0.01)
