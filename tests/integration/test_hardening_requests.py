"""What byok refuses at its door (issue 25, items 3, 4, 6 and 9): what a web page could send,
a non-loopback bind, clients that drip their requests, a broken HTTP/2 preface, a gzip body
that inflates past max_body_bytes. The real daemon over real loopback sockets, requests
written byte by byte where the bytes are the point."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import pytest
import trio
import trio.testing

from byok.config_load import load_config
from byok.daemon import StartupError, run_daemon
from byok.devtools.cursor_sim import user_turn
from byok.http import serve
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.http.serve import Receive, Scope, Send, is_loopback, serve_app
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from tests.integration.conftest import Daemon, start_daemon, write_config
from tests.integration.test_cli import byok
from tests.support.fake_provider import chat_text_script

RUN_SSE = "/agent.v1.AgentService/RunSSE"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"
OTHER = "/aiserver.v1.AiService/Whatever"  # relayed: no byok or offline answer
EVIL = "https://evil.example"


def port_of(d: Daemon) -> int:
    return int(d.base_url.rsplit(":", 1)[1])


@attrs.frozen
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


async def exchange(port: int, method: str, path: str, body: bytes = b"", **headers: str) -> Answer:
    """One HTTP/1.1 request, written as the bytes a browser or a script would send."""
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", "connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body:
        lines.append(f"content-length: {len(body)}")
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        got = b""
        while chunk := await stream.receive_some(65536):
            got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = [(k.strip().lower(), v.strip()) for k, _, v in (h.partition(":") for h in header_lines)]
    if ("transfer-encoding", "chunked") in fields:
        chunks = b""
        while (size := int(rest.split(b"\r\n", 1)[0], 16)) > 0:
            rest = rest.split(b"\r\n", 1)[1]
            chunks, rest = chunks + rest[:size], rest[size + 2 :]
        rest = chunks
    return Answer(int(status_line.split()[1]), fields, rest)


def run_sse_body(rid: str) -> bytes:
    return encode_frame(bytes(aiserver.BidiRequestId(request_id=rid)))


def run_request_append(rid: str, model: str = "byok-demo") -> bytes:
    msg = agent.AgentClientMessage(
        run_request=user_turn("hi", conversation_id="c-" + rid, model_id=model, message_id="m1")
    )
    return bytes(
        aiserver.BidiAppendRequest(
            data=bytes(msg).hex(), request_id=aiserver.BidiRequestId(request_id=rid), append_seqno=0
        )
    )


@attrs.define
class Upstream:
    """Cursor's backend: records what reaches it; answers with a CORS grant byok must drop."""

    seen: list[tuple[str, str]] = attrs.Factory(list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        if scope["method"] != "HEAD":  # byok's reachability probe
            self.seen.append((scope["method"], scope["path"]))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"access-control-allow-origin", b"*"),
                    (b"Access-Control-Allow-Credentials", b"true"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
async def relaying(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[tuple[Daemon, Upstream]]:
    upstream = Upstream()
    url, stop = await serve_app(upstream, host="127.0.0.1", port=0, nursery=nursery)
    async with start_daemon(tmp_path, nursery, upstream=url) as d:
        yield d, upstream
    stop()


# --- Item 3: web pages -----------------------------------------------------------------------


async def test_a_web_pages_run_is_refused_and_the_provider_never_called(daemon: Daemon) -> None:
    """RunSSE and BidiAppend as browser "simple requests" (text/plain, no preflight), with and
    without the page's Origin: refused before any handler, so no run starts."""
    port = port_of(daemon)
    daemon.provider.enqueue(chat_text_script(["stolen"]))
    simple = {"content_type": "text/plain;charset=UTF-8"}
    sse = await exchange(port, "POST", RUN_SSE, run_sse_body("req-web"), origin=EVIL, **simple)
    append = await exchange(port, "POST", BIDI_APPEND, run_request_append("req-web"), origin=EVIL, **simple)
    assert (sse.status, append.status) == (403, 403)
    assert json.loads(append.body) == {
        "code": "permission_denied",
        "message": f"requests from web origin {EVIL!r} are refused",
    }
    # No Origin (an old browser, a form), or a body a page sends without a type (a Blob).
    no_origin = await exchange(port, "POST", BIDI_APPEND, run_request_append("req-web"), **simple)
    untyped = await exchange(port, "POST", BIDI_APPEND, run_request_append("req-web"))
    form = await exchange(
        port, "POST", RUN_SSE, run_sse_body("req-web"), content_type="application/x-www-form-urlencoded"
    )
    assert (no_origin.status, untyped.status, form.status) == (415, 415, 415)
    assert json.loads(no_origin.body)["message"] == "content type 'text/plain;charset=UTF-8' is refused"
    # A preflight is refused too, and nothing anywhere grants CORS.
    preflight = await exchange(
        port, "OPTIONS", BIDI_APPEND, origin=EVIL, access_control_request_method="POST"
    )
    assert preflight.status == 403
    for answer in (sse, append, no_origin, untyped, form, preflight):
        assert not [k for k, _ in answer.headers if k.startswith("access-control-")]
    assert daemon.provider.requests == []
    # Cursor's own requests, same ids, go through: the refusals left no trace.
    tr = await daemon.sim.run(
        "req-web", user_turn("hi", conversation_id="c", model_id="byok-demo", message_id="m")
    )
    assert tr.end_stream == {} and tr.text() == "stolen"


async def test_the_relay_refuses_a_web_page_and_grants_no_cors(relaying: tuple[Daemon, Upstream]) -> None:
    d, upstream = relaying
    port = port_of(d)
    refused = [
        await exchange(port, "POST", OTHER, b"{}", content_type="text/plain"),
        await exchange(port, "POST", OTHER, b"x=1", content_type="application/x-www-form-urlencoded"),
        await exchange(port, "POST", OTHER, b"\x0a\x00"),  # a body with no type
        await exchange(port, "POST", OTHER, b"{}", content_type="application/json", origin=EVIL),
        await exchange(port, "GET", "/auth/full_stripe_profile", origin="null"),
        await exchange(port, "OPTIONS", OTHER),
    ]
    assert [a.status for a in refused] == [415, 415, 415, 403, 403, 405]
    assert upstream.seen == []  # never reached
    # What Cursor's client sends is relayed, upstream's CORS grant dropped on the way back.
    served = [
        await exchange(port, "POST", OTHER, b"{}", content_type="application/json"),
        await exchange(port, "POST", OTHER, b"\x0a\x00", content_type="application/proto"),
        await exchange(port, "POST", OTHER, b"", content_type="application/connect+json"),
        await exchange(port, "GET", "/auth/full_stripe_profile"),
        await exchange(
            port, "POST", OTHER, b"{}", content_type="application/json", origin="vscode-file://vscode-app"
        ),
    ]
    assert [a.status for a in served] == [200] * 5
    assert len(upstream.seen) == 5
    for answer in served:
        assert answer.body == b"{}"
        assert not [k for k, _ in answer.headers if k.startswith("access-control-")]


async def test_http2_requests_are_held_to_the_same_rules(daemon: Daemon) -> None:
    async with httpx.AsyncClient(http1=False, http2=True, base_url=daemon.base_url) as h2:
        web = await h2.post(
            OTHER, content=b"{}", headers={"content-type": "application/json", "origin": EVIL}
        )
        plain = await h2.post(RUN_SSE, content=run_sse_body("r"), headers={"content-type": "text/plain"})
        health = await h2.get("/byok/healthz")
    assert (web.http_version, web.status_code, plain.status_code, health.status_code) == (
        "HTTP/2",
        403,
        415,
        200,
    )


# --- Item 4: loopback only -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LocalHost.", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.10", False),
        ("fe80::1", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("server", "proxy"), [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "::")])
async def test_a_non_loopback_bind_refuses_to_start(tmp_path: Path, server: str, proxy: str) -> None:
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=tmp_path / "data")
    cfg.write_text(
        cfg.read_text().replace('host = "127.0.0.1"', f'host = "{server}"')
        + f'\n[proxy]\nenabled = true\nhost = "{proxy}"\nport = 0\n'
    )
    with pytest.raises(StartupError) as e:
        await run_daemon(load_config(cfg, overrides={}))
    bad, what = (server, "") if server != "127.0.0.1" else (proxy, " (proxy)")
    assert str(e.value).startswith(f"refusing to listen on {bad!r}{what}: ")
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_serve_with_host_0000_says_why_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=tmp_path / "data")
    result = byok("serve", "--config", str(cfg), "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 2, result.stderr  # a config error: the service is not restarted
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("byok: refusing to listen on '0.0.0.0': ") and "loopback" in last
    assert "Traceback" not in result.stderr


# --- Item 6: slow clients ----------------------------------------------------------------------
# Under MockClock(autojump_threshold=0): the clock jumps only when every task waits, and a
# loopback write is readable at once, so each drip reaches the server at its virtual time.

T = serve.REQUEST_READ_TIMEOUT_S
DRIP_S = 1.0


async def held_for(stream: trio.SocketStream, drip: bytes | None) -> float:
    """How long the server keeps the connection while the client sends ``drip`` every DRIP_S
    (None: nothing at all); 4 * T at most."""
    start = trio.current_time()
    async with stream:
        while trio.current_time() - start < 4 * T:
            try:
                if drip is not None:
                    await stream.send_all(drip)
                with trio.move_on_after(DRIP_S):
                    if await stream.receive_some(4096) == b"":
                        break
            except trio.BrokenResourceError:  # reset: the server closed with our bytes unread
                break
    return trio.current_time() - start


async def test_dripping_clients_are_cut_off(daemon: Daemon, autojump_clock: trio.testing.MockClock) -> None:
    """20 connections dripping a header block, 20 dripping a body (an append's, a RunSSE's), 20
    sending nothing: each is closed REQUEST_READ_TIMEOUT_S after it began."""
    port = port_of(daemon)
    held: dict[str, list[float]] = {"head": [], "append": [], "runsse": [], "silent": []}

    async def client(kind: str) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        drip: bytes | None = b"x-drip: 1\r\n"
        if kind == "head":
            await stream.send_all(f"POST {BIDI_APPEND} HTTP/1.1\r\nhost: x\r\n".encode())
        elif kind in ("append", "runsse"):
            path = BIDI_APPEND if kind == "append" else RUN_SSE
            ctype = "application/proto" if kind == "append" else "application/connect+proto"
            head = (
                f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: {ctype}\r\ncontent-length: 100000\r\n\r\n"
            )
            await stream.send_all(head.encode())
            drip = b"\x0a"
        else:
            drip = None
        held[kind].append(await held_for(stream, drip))

    async with trio.open_nursery() as nursery:
        for kind in held:
            for _ in range(20):
                nursery.start_soon(client, kind)
    for kind, times in held.items():
        assert len(times) == 20
        assert all(T <= t <= T + DRIP_S for t in times), (kind, times)


async def test_a_kept_alive_connection_and_a_quiet_run_stream_are_not_cut(
    daemon: Daemon, autojump_clock: trio.testing.MockClock
) -> None:
    """What the client finished sending is not timed: a connection idle between requests
    (the keep-alive timeout applies, KEEP_ALIVE_TIMEOUT_S), a RunSSE whose client sends
    nothing after its request while the run streams, with a provider pause of 3 * T."""
    stream = await trio.open_tcp_stream("127.0.0.1", port_of(daemon))

    async def healthz() -> None:
        await stream.send_all(b"GET /byok/healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"]}"):
            got += await stream.receive_some(65536)
        assert got.startswith(b"HTTP/1.1 200")

    await healthz()
    with trio.move_on_after(3 * T) as idle:
        await stream.receive_some(4096)  # b"" if the server closed it
    assert idle.cancelled_caught
    await healthz()  # the same connection
    await stream.aclose()

    daemon.provider.enqueue(chat_text_script(["before", "after"], delay_s=3 * T))
    run = user_turn("hi", conversation_id="c-slow", model_id="byok-demo", message_id="m")
    started = trio.current_time()
    tr = await daemon.sim.run("req-slow", run)
    assert tr.end_stream == {} and tr.text() == "beforeafter"
    assert trio.current_time() - started >= 3 * T
    assert [f.kind for f in tr.frames].count("interaction_update.heartbeat") >= 3 * T / 5.0 - 1


# --- Item 9: a broken HTTP/2 preface, gzip past max_body_bytes --------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.mark.parametrize(
    "after",
    [
        b"garbage garbage garbage\r\n",  # read as a frame header announcing 6.7 MB
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
        b"hello",  # not even a whole frame header: its type byte is already wrong
        b"\x00\x00\x00\x01\x00\x00\x00\x00\x01",  # a HEADERS frame before SETTINGS
    ],
)
async def test_an_h2_preface_followed_by_garbage_gets_goaway_and_close(daemon: Daemon, after: bytes) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port_of(daemon))
    got = b""
    async with stream:
        await stream.send_all(PREFACE + after)
        with trio.fail_after(10):  # a guard: the answer is immediate
            while chunk := await stream.receive_some(65536):
                got += chunk
    frames = []
    while got:
        length = int.from_bytes(got[:3], "big")
        frames.append((got[3], got[9 : 9 + length]))
        got = got[9 + length :]
    assert [kind for kind, _ in frames] == [0x4, 0x7]  # the server's SETTINGS, then GOAWAY
    error_code = int.from_bytes(frames[1][1][4:8], "big")
    assert error_code in (0x1, 0x6)  # PROTOCOL_ERROR, FRAME_SIZE_ERROR


async def test_gzip_inflates_no_further_than_max_body_bytes(tmp_path: Path, nursery: trio.Nursery) -> None:
    limit = 1 << 20
    async with start_daemon(tmp_path, nursery, server_extra=f"max_body_bytes = {limit}") as d:

        def append(size: int) -> bytes:  # a relayed append (not an agent message) of ``size`` bytes
            req = aiserver.BidiAppendRequest(
                data="ab" * ((size - 40) // 2), request_id=aiserver.BidiRequestId(request_id="r-gz")
            )
            return bytes(req)

        over, under = append(limit + 1000), append(limit - 1000)
        assert len(over) > limit > len(under)
        answers = []
        for body in (over, under):
            answers.append(
                await d.client.post(
                    d.base_url + BIDI_APPEND,
                    content=gzip.compress(body),
                    headers={"content-type": "application/proto", "content-encoding": "gzip"},
                )
            )
        refused, relayed = answers
        assert refused.status_code == 400
        assert refused.json()["message"].endswith(f"decompressed message exceeds {limit} bytes")
        assert relayed.status_code == 502  # decoded, not a byok run: relayed to the dead upstream

    # RunSSE: the default limit, 32 MiB (it was 64).
    (tmp_path / "2").mkdir()
    async with start_daemon(tmp_path / "2", nursery) as d2:
        bomb = gzip.compress(bytes(33 * 1024 * 1024))
        async with d2.client.stream(
            "POST",
            d2.base_url + RUN_SSE,
            content=bomb,
            headers={"content-type": "application/proto", "content-encoding": "gzip"},
        ) as resp:
            frames = FrameDecoder().feed(await resp.aread())
    assert frames[-1].end_stream
    assert b"decompressed message exceeds 33554432 bytes" in frames[-1].payload
