"""The Forwarder against a real loopback upstream, both served by hypercorn via serve_app."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import pytest
import trio

from byok.http.forwarder import Forwarder, filter_headers
from byok.http.serve import ASGIApp, Receive, Scope, Send, serve_app

GZ_BODY = gzip.compress(b'{"hello": "compressed world"}' * 20)


async def _read_body(receive: Receive, on_chunk: Any = None) -> bytes:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RuntimeError("client went away")
        chunk = message.get("body", b"")
        if chunk and on_chunk is not None:
            on_chunk(chunk)
        body += chunk
        if not message.get("more_body", False):
            return body


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    # hypercorn needs lifespan either completed or refused by raising; returning breaks it.
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


@attrs.define
class Upstream:
    """A loopback stand-in for Cursor's backend, with hooks the tests synchronise on."""

    got_first_chunk: trio.Event = attrs.field(factory=trio.Event)
    client_got_first: trio.Event = attrs.field(factory=trio.Event)
    saw_disconnect: trio.Event = attrs.field(factory=trio.Event)
    seen: list[Scope] = attrs.field(factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        self.seen.append(scope)
        path = scope["path"]
        if path.endswith("/echo"):
            body = await _read_body(receive)
            info = {
                "method": scope["method"],
                "raw_path": scope["raw_path"].decode(),
                "query": scope["query_string"].decode(),
                "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
                "body": body.decode(),
            }
            payload = json.dumps(info).encode()
            await _respond(
                send,
                200,
                payload,
                [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-up", b"kept"),
                    (b"keep-alive", b"timeout=5"),
                    (b"connection", b"x-hop"),
                    (b"x-hop", b"dropped"),
                    (b"proxy-authenticate", b"Basic"),
                    (b"alt-svc", b'h3=":443"'),
                ],
            )
        elif path == "/collect":
            body = await _read_body(receive, on_chunk=lambda _c: self.got_first_chunk.set())
            await _respond(send, 200, body, [(b"content-type", b"application/octet-stream")])
        elif path == "/drip":
            await _read_body(receive)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"one", "more_body": True})
            with trio.fail_after(5):
                await self.client_got_first.wait()
            await send({"type": "http.response.body", "body": b"two", "more_body": True})
            await send({"type": "http.response.body", "body": b"three"})
        elif path.startswith("/status/"):
            await _read_body(receive)
            status = int(path.rsplit("/", 1)[1])
            await _respond(
                send, status, f"status {status} body\n".encode(), [(b"content-type", b"text/plain")]
            )
        elif path == "/gz":
            await _read_body(receive)
            headers = [
                (b"content-type", b"application/json"),
                (b"content-encoding", b"gzip"),
                (b"content-length", str(len(GZ_BODY)).encode()),
            ]
            await _respond(send, 200, GZ_BODY, headers)
        elif path == "/dies":
            await _read_body(receive)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            # Returning without the final body message: hypercorn drops the connection.
        elif path == "/forever":
            await _read_body(receive)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"tick", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.saw_disconnect.set()
        else:
            await _respond(send, 404, b"", [])


@attrs.frozen
class Rig:
    upstream: Upstream
    upstream_url: str
    base_url: str
    client: httpx.AsyncClient


@asynccontextmanager
async def rig(
    *, upstream_url: str | None = None, h2c: bool = True, http2_client: bool = False
) -> AsyncIterator[Rig]:
    upstream = Upstream()
    async with (
        httpx.AsyncClient(
            http2=False,
            timeout=httpx.Timeout(connect=10, read=None, write=None, pool=None),
            follow_redirects=False,
        ) as up_client,
        trio.open_nursery() as nursery,
    ):
        up_url, stop_up = await serve_app(upstream, host="127.0.0.1", port=0, nursery=nursery)
        forwarder = Forwarder(upstream_url or up_url, up_client, logging.getLogger("test.forward"))
        base_url, stop = await serve_app(forwarder, host="127.0.0.1", port=0, nursery=nursery, h2c=h2c)
        try:
            async with httpx.AsyncClient(
                base_url=base_url, timeout=10, http1=not http2_client, http2=http2_client
            ) as client:
                with trio.fail_after(15):
                    yield Rig(upstream, up_url, base_url, client)
        finally:
            stop()
            stop_up()


async def test_request_body_streams_to_upstream() -> None:
    async with rig() as r:

        async def body() -> AsyncIterator[bytes]:
            yield b"first;"
            # Upstream must see the first chunk while we still hold the rest back.
            with trio.fail_after(5):
                await r.upstream.got_first_chunk.wait()
            yield b"second;"
            yield b"third"

        response = await r.client.post("/collect", content=body())
        assert response.status_code == 200
        assert response.content == b"first;second;third"


async def test_response_body_streams_to_client() -> None:
    async with rig() as r, r.client.stream("GET", "/drip") as response:
        chunks = response.aiter_raw()
        first = b""
        while len(first) < 3:
            first += await chunks.__anext__()
        assert first == b"one"
        # Upstream holds "two" until the client has seen "one": proves no buffering.
        r.upstream.client_got_first.set()
        rest = b"".join([c async for c in chunks])
        assert first + rest == b"onetwothree"


@pytest.mark.parametrize("status", [418, 500, 404, 302])
async def test_status_and_body_pass_through(status: int) -> None:
    async with rig() as r:
        response = await r.client.get(f"/status/{status}")
        assert response.status_code == status
        assert response.content == f"status {status} body\n".encode()
        assert response.headers["content-type"] == "text/plain"


async def test_headers_path_and_query(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.forward")
    async with rig() as r:
        response = await r.client.post(
            "/a%2Fb/echo?x=1&y=%2F%20z&flag",
            content=b"payload",
            headers={
                "x-custom": "kept",
                "authorization": "Bearer tok",
                "user-agent": "cursor-test/1",
                "accept-encoding": "identity",
                "connection": "keep-alive, x-listed",
                "x-listed": "dropped",
                "keep-alive": "timeout=5",
                "proxy-authorization": "Basic abc",
                "te": "trailers",
            },
        )
    assert response.status_code == 200
    info = response.json()
    assert info["method"] == "POST"
    assert info["raw_path"] == "/a%2Fb/echo"
    assert info["query"] == "x=1&y=%2F%20z&flag"
    assert info["body"] == "payload"
    seen = dict(info["headers"])
    assert len(seen) == len(info["headers"]), "no header duplicated"
    assert seen["host"] == r.upstream_url.removeprefix("http://")
    assert seen["x-custom"] == "kept"
    assert seen["authorization"] == "Bearer tok"
    # byok's own httpx client must not impose its defaults on the relayed request.
    assert seen["user-agent"] == "cursor-test/1"
    assert seen["accept-encoding"] == "identity"
    assert seen["content-length"] == "7"
    for name in ("x-listed", "keep-alive", "proxy-authorization", "te", "transfer-encoding"):
        assert name not in seen
    assert seen.get("connection", "keep-alive") == "keep-alive"  # httpcore's own, if any

    assert response.headers["x-up"] == "kept"
    for name in ("keep-alive", "x-hop", "proxy-authenticate", "alt-svc"):
        assert name not in response.headers
    assert len(response.headers.get_list("date")) == 1
    assert int(response.headers["content-length"]) == len(response.content)
    assert any(
        rec.getMessage().startswith("forward POST /a/b/echo -> 200 in ")
        and rec.getMessage().endswith(" ms")
        and rec.levelno == logging.INFO
        for rec in caplog.records
    )


async def test_gzip_passes_through_untouched() -> None:
    async with rig() as r, r.client.stream("GET", "/gz", headers={"accept-encoding": "gzip"}) as response:
        raw = b"".join([c async for c in response.aiter_raw()])
    assert response.headers["content-encoding"] == "gzip"
    assert response.headers["content-length"] == str(len(GZ_BODY))
    assert raw == GZ_BODY


async def test_502_when_upstream_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    # Port 9 (discard): nothing listens, and it is no ephemeral port a client could connect to
    # itself on (a freed ephemeral port can be).
    async with rig(upstream_url="http://127.0.0.1:9") as r:
        response = await r.client.post("/aiserver.v1.AiService/Whatever", content=b"x")
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["code"] == "unavailable"
    assert body["message"].startswith("upstream unreachable: ConnectError")
    assert any("-> 502" in rec.getMessage() and rec.levelno == logging.WARNING for rec in caplog.records)


async def test_upstream_dying_mid_body_truncates_client_response() -> None:
    async with rig() as r, r.client.stream("GET", "/dies") as response:
        assert response.status_code == 200
        got = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async for chunk in response.aiter_raw():
                got += chunk
        assert got == b"partial"


async def test_client_disconnect_stops_upstream_stream() -> None:
    async with rig() as r:
        async with r.client.stream("GET", "/forever") as response:
            async for chunk in response.aiter_raw():
                assert chunk == b"tick"
                break
        with trio.fail_after(5):
            await r.upstream.saw_disconnect.wait()


async def test_h2c_prior_knowledge_client() -> None:
    async with rig(http2_client=True) as r:
        response = await r.client.post("/status/418", content=b"abc")
    assert response.http_version == "HTTP/2"
    assert response.status_code == 418
    assert response.content == b"status 418 body\n"


async def test_h2c_disabled_refuses_http2() -> None:
    async with rig(h2c=False, http2_client=True) as r:
        response = await r.client.get("/status/418")
    assert response.status_code == 505
    async with rig(h2c=False) as r:
        assert (await r.client.get("/status/418")).status_code == 418


async def test_serve_app_reports_bound_port_and_shuts_down() -> None:
    async def hello(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        else:
            await _respond(send, 200, b"hi", [])

    app: ASGIApp = hello
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url, stop = await serve_app(app, host="127.0.0.1", port=0, nursery=nursery)
            assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
            async with httpx.AsyncClient() as client:
                assert (await client.get(url)).text == "hi"
            stop()
        # The nursery exited: the server task ended after the shutdown call.


def test_filter_headers_is_pure() -> None:
    headers = [
        (b"Connection", b"close, X-Foo"),
        (b"X-Foo", b"1"),
        (b"X-Bar", b"2"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Proxy-Connection", b"keep-alive"),
        (b":authority", b"x"),
        (b"Content-Length", b"3"),
    ]
    assert filter_headers(headers) == [(b"x-bar", b"2"), (b"content-length", b"3")]
    assert filter_headers(headers, drop=frozenset({b"content-length"})) == [(b"x-bar", b"2")]
