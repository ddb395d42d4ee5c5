"""stream_call against FakeProvider over real loopback HTTP."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator

import httpcore
import httpx
import pytest
import trio

from byok.http.clients import (
    KEEPALIVE_IDLE_S,
    KEEPALIVE_S,
    UPSTREAM_KEEPALIVE_S,
    provider_client,
    upstream_client,
)
from byok.model.events import (
    Done,
    ModelEvent,
    ProviderError,
    Started,
    TextDelta,
    ToolCallEnded,
    UsageReported,
)
from byok.model.request import ModelRequest, ModelSettings, UserTurn
from byok.model.usage import Usage
from byok.providers.openai_chat_request import build_request
from byok.providers.openai_chat_stream import ChatStreamParser
from byok.providers.runner import CallStats, Endpoint, stream_call
from tests.support.fake_provider import (
    FakeProvider,
    Script,
    chat_text_script,
    chat_tool_script,
    error_script,
)

BODY = build_request(ModelRequest("", (), (UserTurn("hi"),), ModelSettings("fake-model")))


@pytest.fixture
async def provider(nursery: trio.Nursery) -> AsyncIterator[tuple[FakeProvider, Endpoint]]:
    fake = FakeProvider()
    base = await fake.start(nursery)
    yield fake, Endpoint(f"{base}/chat/completions", (("authorization", "Bearer sk-test"),))


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as c:
        yield c


class Collector:
    def __init__(self) -> None:
        self.batches: list[list[ModelEvent]] = []

    async def __call__(self, events: list[ModelEvent]) -> None:
        self.batches.append(events)

    @property
    def events(self) -> list[ModelEvent]:
        return [e for b in self.batches for e in b]


async def call(client: httpx.AsyncClient, endpoint: Endpoint, sink: Collector | None = None) -> CallStats:
    return await stream_call(client, endpoint, BODY, ChatStreamParser(), sink or Collector())


async def test_text_stream_is_delivered_incrementally(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(chat_text_script(["Hel", "lo"], usage=(12, 2), delay_s=0.01))
    sink = Collector()
    stats = await call(client, endpoint, sink)
    assert sink.events == [
        Started(),
        TextDelta("Hel"),
        TextDelta("lo"),
        UsageReported(Usage(12, 2, 0)),
        Done("stop"),
    ]
    assert len(sink.batches) >= 4  # one per streamed chunk, not one at the end
    assert stats.status == 200 and stats.events == 5 and stats.bytes > 0
    assert stats.ttfb_s is not None and stats.ttft_s is not None and stats.duration_s is not None
    assert 0 <= stats.ttfb_s <= stats.ttft_s <= stats.duration_s
    (req,) = fake.requests
    assert (req.method, req.path, req.body) == ("POST", "/v1/chat/completions", BODY)
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["accept"] == "text/event-stream"
    assert req.json["stream_options"] == {"include_usage": True}


async def test_connection_is_reused_and_empty_queue_is_500(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(chat_text_script(["a"]), chat_text_script(["b"]))
    await call(client, endpoint)
    await call(client, endpoint)
    with pytest.raises(ProviderError, match="no script") as e:
        await call(client, endpoint)
    assert (e.value.status, e.value.retryable) == (500, True)


async def test_tool_call_stream(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(chat_tool_script([("call_1", "ls", '{"dir":"."}'), ("call_2", "cat", '{"f":"x"}')]))
    sink = Collector()
    await call(client, endpoint, sink)
    ended = [e for e in sink.events if isinstance(e, ToolCallEnded)]
    assert ended == [ToolCallEnded(0, '{"dir":"."}'), ToolCallEnded(1, '{"f":"x"}')]
    assert sink.events[-1] == Done("tool_use")


async def test_429_with_retry_after_is_retryable(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(error_script(429, "Rate limit reached for requests", retry_after="3"))
    stats = CallStats()
    with pytest.raises(ProviderError, match="Rate limit reached") as e:
        await stream_call(client, endpoint, BODY, ChatStreamParser(), Collector(), stats=stats)
    assert (e.value.status, e.value.retryable, e.value.retry_after_s) == (429, True, 3.0)
    assert stats.status == 429 and stats.duration_s is not None  # filled in place on failure


async def test_json_body_on_200_is_an_error(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(error_script(200, "quota exceeded"))
    with pytest.raises(ProviderError, match=r"got JSON.*quota exceeded") as e:
        await call(client, endpoint)
    assert not e.value.retryable


async def test_an_html_page_on_200_is_an_error_that_points_at_base_url(provider, client) -> None:
    """A web app on the base_url's port (a chat UI, a login portal) answers any path with a 200
    page: said as such, not as a stream that ended early."""
    fake, endpoint = provider
    page = b"<!doctype html><html><head><title>Open WebUI</title></head><body></body></html>"
    fake.enqueue(Script(headers=[("content-type", "text/html; charset=utf-8")], chunks=[page]))
    with pytest.raises(ProviderError) as e:
        await call(client, endpoint)
    assert e.value.message == "expected an event stream, got an HTML page: is base_url the API's address?"
    assert not e.value.retryable


async def test_400_is_not_retryable(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(error_script(400, "Invalid 'messages[1].content'"))
    with pytest.raises(ProviderError, match="HTTP 400: Invalid 'messages") as e:
        await call(client, endpoint)
    assert (e.value.status, e.value.retryable) == (400, False)


async def test_connection_closed_mid_stream(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(chat_text_script(["a", "b", "c"], close_after=2))
    sink = Collector()
    with pytest.raises(ProviderError) as e:
        await call(client, endpoint, sink)
    assert e.value.retryable  # a transport failure; whether to retry after output is the caller's call
    assert sink.events[:2] == [Started(), TextDelta("a")]


async def test_stream_without_terminator_is_truncation(provider, client) -> None:
    fake, endpoint = provider
    script = chat_text_script(["a"])
    fake.enqueue(Script(chunks=script.chunks[:2]))  # well-formed HTTP, cut SSE
    with pytest.raises(ProviderError, match="before finish"):
        await call(client, endpoint)


async def test_connect_error_is_retryable_and_names_the_server(client) -> None:
    port = 9  # nothing listens there (and no client picks it as its own source port)
    with pytest.raises(ProviderError) as e:
        await call(client, Endpoint(f"http://127.0.0.1:{port}/v1/chat/completions?key=secret", ()))
    assert e.value.retryable
    assert e.value.message.startswith(f"cannot connect to http://127.0.0.1:{port} (ConnectError: ")
    assert "secret" not in e.value.message


async def test_hang_before_headers_is_cancelled_by_the_callers_scope(provider, client) -> None:
    # Real time, not MockClock: with autojump the clock would leap while the socket I/O is
    # in flight, so the deadline could fire before the request even reached the server.
    fake, endpoint = provider
    fake.enqueue(Script(hang_before_headers=True))
    start = trio.current_time()
    with trio.move_on_after(0.3) as scope:
        await call(client, endpoint)
    assert scope.cancelled_caught
    assert len(fake.requests) == 1  # it was waiting for headers, not still connecting
    assert trio.current_time() - start < 5


async def test_slow_body_is_cancelled_by_the_callers_scope(provider, client) -> None:
    fake, endpoint = provider
    fake.enqueue(chat_text_script(["a", "b"], delay_s=60))
    sink = Collector()
    with trio.move_on_after(0.3) as scope:
        await call(client, endpoint, sink)
    assert scope.cancelled_caught
    assert sink.events == [Started()]  # the first chunk arrived; the rest never did


async def test_hang_before_headers_under_autojump_clock(provider, autojump_clock) -> None:
    # The same scope under MockClock(autojump_threshold=0): an hour-long deadline passes in no
    # real time. Loopback I/O is normally ready before the clock jumps, but under heavy load
    # the jump could come first, so only the cancellation itself is asserted here.
    fake, endpoint = provider
    fake.enqueue(Script(hang_before_headers=True))
    async with httpx.AsyncClient(timeout=None) as client:  # httpx timeouts would jump too
        with trio.move_on_after(3600) as scope:
            await call(client, endpoint)
    assert scope.cancelled_caught


@pytest.mark.parametrize(
    ("make_client", "keepalive_s"),
    [(provider_client, KEEPALIVE_S), (upstream_client, UPSTREAM_KEEPALIVE_S)],
)
async def test_idle_connections_outlive_a_users_pause(
    provider, make_client, keepalive_s, monkeypatch
) -> None:
    """A turn after a pause of reading and typing reuses the connection (no new TCP and TLS
    handshake); one idle past the keep-alive, or closed by the server meanwhile, is replaced.
    httpcore times idleness with time.monotonic: shifted here instead of sleeping."""
    assert keepalive_s >= 50  # httpx's default is 5 s
    fake, endpoint = provider
    shift = 0.0
    real = time.monotonic
    monkeypatch.setattr(httpcore._async.http11.time, "monotonic", lambda: real() + shift)
    async with make_client() as c:
        fake.enqueue(*(chat_text_script([str(k)]) for k in range(4)))
        await call(c, endpoint)
        shift = keepalive_s - 1
        await call(c, endpoint)
        assert fake.connections == 1
        shift += keepalive_s + 1
        await call(c, endpoint)
        assert fake.connections == 2
        with trio.fail_after(5):
            await fake.close_idle()
        await call(c, endpoint)
        assert fake.connections == 3


def _established_to(port: int) -> list[tuple[int, int]]:
    """(timer kind, ticks until it fires) of each established socket whose peer is ``port``, from
    Linux's socket tables (timer kind 2: the keepalive timer)."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                timer, when = fields[5].split(":")
                if remote_port == port and fields[3] == "01":
                    rows.append((int(timer, 16), int(when, 16)))
    return rows


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket tables")
@pytest.mark.parametrize("make_client", [provider_client, upstream_client])
async def test_outgoing_connections_probe_a_silent_peer(provider, make_client) -> None:
    """With no read timeout (a model may think for minutes), only TCP keepalive finds a
    connection that died silently (a laptop's sleep, a network change). The idle pooled
    connection has its keepalive timer armed, due within KEEPALIVE_IDLE_S."""
    fake, endpoint = provider
    port = httpx.URL(endpoint.url).port
    assert port is not None
    async with make_client() as c:
        fake.enqueue(chat_text_script(["x"]))
        await call(c, endpoint)
        timers = _established_to(port)
        assert len(timers) == 1, timers
        (kind, ticks) = timers[0]
        assert kind == 2 and 0 < ticks <= KEEPALIVE_IDLE_S * os.sysconf("SC_CLK_TCK")
