"""Request targets that are not a path (issue 25, items 1, 2 and the last of 9), against the real
daemon over real sockets: raw HTTP/1.1 request lines and raw h2c frames, since HTTP clients only
send well-formed targets. A loopback "attacker" server counts every connection byok makes to it:
it must stay at zero."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import attrs
import h2.config
import h2.connection
import h2.events
import pytest
import trio

from byok.http.proxy import BadRequest, parse_authority
from byok.http.serve import serve_app
from tests.integration.conftest import Daemon, start_daemon
from tests.integration.test_forwarder import Upstream
from tests.integration.test_forwarder import rig as forwarder_rig
from tests.integration.test_proxy import running_proxy


@attrs.define
class Attacker:
    """Answers anything with 200 "pwned", so a relay that reached it would show."""

    connections: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        async with stream:
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\npwned")


@attrs.frozen
class Rig:
    daemon: Daemon
    upstream: Upstream
    attacker: Attacker
    attacker_port: int

    @property
    def evil(self) -> str:
        return f"127.0.0.1:{self.attacker_port}"


@pytest.fixture
async def rig(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Rig]:
    attacker = Attacker()
    listeners = await nursery.start(partial(trio.serve_tcp, attacker.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    upstream = Upstream()
    up_url, stop_up = await serve_app(upstream, host="127.0.0.1", port=0, nursery=nursery)
    async with start_daemon(tmp_path, nursery, upstream=up_url) as daemon:
        yield Rig(daemon, upstream, attacker, port)
    stop_up()


def _address(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def http1(base_url: str, request_line: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request on a fresh connection, its line exactly as given; (status, body)."""
    head = f"{request_line} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n"
    if body:
        head += f"content-type: application/proto\r\ncontent-length: {len(body)}\r\n"
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(*_address(base_url))
        async with stream:
            await stream.send_all(head.encode() + b"\r\n" + body)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


async def h2c(base_url: str, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One prior-knowledge HTTP/2 request whose ``:path`` is exactly ``path``; (status, body)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    headers = [(b":method", method.encode()), (b":scheme", b"http"), (b":authority", b"localhost")]
    headers.append((b":path", path.encode()))
    if body:
        headers.append((b"content-type", b"application/proto"))
    conn.send_headers(sid, headers, end_stream=not body)
    if body:
        conn.send_data(sid, body, end_stream=True)
    status, data = 0, b""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(*_address(base_url))
        async with stream:
            await stream.send_all(conn.data_to_send())
            while chunk := await stream.receive_some(65536):
                for event in conn.receive_data(chunk):
                    if isinstance(event, h2.events.ResponseReceived):
                        status = int(dict(event.headers)[b":status"])
                    elif isinstance(event, h2.events.DataReceived):
                        data += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    elif isinstance(event, h2.events.StreamEnded):
                        return status, data
                    elif isinstance(event, h2.events.StreamReset):
                        raise AssertionError(f"stream reset: {event.error_code!r}")
                await stream.send_all(conn.data_to_send())
    raise AssertionError("connection closed before the response ended")


def _assert_refused(status: int, body: bytes) -> None:
    assert status == 400, body
    error = json.loads(body)
    assert error["code"] == "invalid_argument"
    assert error["message"] and "\n" not in error["message"]


def _assert_quiet_log(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


# {evil} is the attacker's host:port, {port} its port alone.
TARGETS = [
    pytest.param("GET @{evil}/x", id="userinfo"),
    pytest.param("GET #@{evil}/x", id="fragment-userinfo"),
    pytest.param("GET %2F@{evil}/x", id="escaped-slash-userinfo"),
    pytest.param("GET /x#@{evil}/y", id="fragment-in-path"),
    pytest.param("GET http://{evil}/x", id="absolute-form"),
    pytest.param("CONNECT {evil}", id="connect"),
    pytest.param("GET :{port}/x", id="port"),
    pytest.param("GET .example/x", id="host-suffix"),
    pytest.param("GET *", id="asterisk"),
    pytest.param("OPTIONS *", id="options-asterisk"),
    pytest.param("GET ?x=1", id="empty-path"),
    # Decoded, these are routes byok answers itself; the raw target is still no path.
    pytest.param("POST %2Faiserver.v1.AiService/AvailableModels", id="escaped-model-list"),
    pytest.param("POST %2Fagent.v1.AgentService/RunSSE", id="escaped-run-sse"),
]


@pytest.mark.parametrize("line", TARGETS)
async def test_a_target_that_is_no_path_is_refused(
    rig: Rig, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    request_line = line.format(evil=rig.evil, port=rig.attacker_port)
    body = b"\x00\x00\x00\x00\x02hi" if request_line.startswith("POST") else b""
    status, answer = await http1(rig.daemon.base_url, request_line, body)
    _assert_refused(status, answer)
    assert rig.attacker.connections == 0
    assert rig.upstream.seen == []
    _assert_quiet_log(caplog)


async def test_a_post_body_does_not_carry_a_relay(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    status, answer = await http1(rig.daemon.base_url, f"POST @{rig.evil}/x", b"x" * 100_000)
    _assert_refused(status, answer)
    assert rig.attacker.connections == 0 and rig.upstream.seen == []
    _assert_quiet_log(caplog)


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_an_h2c_path_that_is_no_path_is_refused(
    rig: Rig, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = b"payload" if method == "POST" else b""
    for path in (f"@{rig.evil}/x", f"http://{rig.evil}/x", f"%2F@{rig.evil}/x"):
        status, answer = await h2c(rig.daemon.base_url, method, path, body)
        _assert_refused(status, answer)
    assert rig.attacker.connections == 0
    assert rig.upstream.seen == []
    _assert_quiet_log(caplog)


async def test_a_path_is_relayed_as_sent(rig: Rig) -> None:
    """``//x`` is not collapsed to ``/x``; escapes in the path and the query stay as sent."""
    status, answer = await http1(rig.daemon.base_url, "GET //x/a%2Fb;c=1/echo?q=%2F%20&flag&a=[1]|2")
    assert status == 200, answer
    info = json.loads(answer)
    assert info["raw_path"] == "//x/a%2Fb;c=1/echo"
    assert info["query"] == "q=%2F%20&flag&a=[1]|2"
    status, answer = await h2c(rig.daemon.base_url, "POST", "//y/echo?z=%41", b"body")
    assert status == 200, answer
    info = json.loads(answer)
    assert (info["raw_path"], info["query"], info["body"]) == ("//y/echo", "z=%41", "body")
    assert rig.attacker.connections == 0


async def test_the_bare_forwarder_refuses_too(caplog: pytest.LogCaptureFixture) -> None:
    """Served without byok's App in front (as `byok` with no local routes), the Forwarder
    checks the target itself before it connects anywhere."""
    async with forwarder_rig() as r:
        for line in ("GET @127.0.0.1:9/x", "GET http://127.0.0.1:9/x", "GET :9/x", "CONNECT 127.0.0.1:9"):
            _assert_refused(*await http1(r.base_url, line))
        assert r.upstream.seen == []
    _assert_quiet_log(caplog)


# --- the HTTPS proxy -------------------------------------------------------------------------

# Each matches "*.cursor.sh" (fnmatch's * takes any character), and as the tunnel's origin
# (https://host:port) it names another host.
SMUGGLING_HOSTS = ["evil.example/x.cursor.sh", "evil.example?.cursor.sh", "evil.example#.cursor.sh"]


def test_parse_authority_takes_only_a_host_name() -> None:
    for host in SMUGGLING_HOSTS:
        with pytest.raises(BadRequest):
            parse_authority(f"{host}:443")
    assert parse_authority("api2.cursor.sh.:443") == ("api2.cursor.sh.", 443)
    assert parse_authority("127.0.0.1:8443") == ("127.0.0.1", 8443)


async def test_the_proxy_refuses_a_connect_host_that_is_no_host_name(tmp_path: Path) -> None:
    async with running_proxy(tmp_path) as proxy:
        for host in SMUGGLING_HOSTS:
            status, answer = await http1(proxy.url, f"CONNECT {host}:443")
            assert status == 400, answer
            assert b"bad host" in answer
