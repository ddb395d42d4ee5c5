"""OfflineAnswers (served only when upstream is down) and the UpstreamHealth probe."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from byok.config import Config, ModelConfig, ProviderConfig, ServerConfig
from byok.http.offline import GET_JSON, UNARY, OfflineAnswers, UpstreamHealth
from byok.http.serve import Receive, Scope, Send, serve_app
from byok.pb.aiserver import v1 as aiserver


def make_config(tmp_path: Path) -> Config:
    provider = ProviderConfig(id="p", kind="openai_chat", base_url="http://127.0.0.1:9/v1")
    models = (ModelConfig(id="byok-a", provider="p", upstream_model="m", context_tokens=1000),)
    return Config(server=ServerConfig(data_dir=tmp_path), providers=(provider,), models=models, source="t")


async def _lifespan(receive: Receive, send: Send) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


@asynccontextmanager
async def offline_app(tmp_path: Path, upstream_ok: bool) -> AsyncIterator[httpx.AsyncClient]:
    answers = OfflineAnswers(make_config(tmp_path))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif not await answers.handle(scope, receive, send, upstream_ok=upstream_ok):
            await send({"type": "http.response.start", "status": 299, "headers": []})
            await send({"type": "http.response.body", "body": b"forwarded"})

    async with trio.open_nursery() as nursery:
        url, stop = await serve_app(app, host="127.0.0.1", port=0, nursery=nursery)
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client
        stop()


@pytest.mark.parametrize("path", sorted(UNARY))
async def test_offline_unary_answers(tmp_path: Path, path: str) -> None:
    async with offline_app(tmp_path, upstream_ok=False) as client:
        resp = await client.post(path, content=b"\x0a\x00", headers={"content-type": "application/proto"})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/proto"
    assert resp.headers["connect-protocol-version"] == "1"
    assert int(resp.headers["content-length"]) == len(resp.content)
    if path.endswith("/GetDefaultModelNudgeData"):
        nudge = aiserver.GetDefaultModelNudgeDataResponse.parse(resp.content)
        assert nudge.models_with_no_default_switch == ["byok-a"]
        assert nudge.should_default_switch_on_new_chat is False
    else:
        assert resp.content == b""  # the empty message of the response type


async def test_is_connected_json_and_get_routes(tmp_path: Path) -> None:
    async with offline_app(tmp_path, upstream_ok=False) as client:
        resp = await client.post("/aiserver.v1.NetworkService/IsConnected", json={})
        assert (resp.status_code, resp.headers["content-type"], resp.json()) == (200, "application/json", {})
        for path in GET_JSON:
            got = await client.get(path)
            assert (got.status_code, got.json()) == (200, {})
        # Not in the offline set, or wrong method: left to the caller.
        assert (await client.post("/aiserver.v1.AiService/StreamChat", content=b"")).status_code == 299
        assert (await client.get("/aiserver.v1.NetworkService/IsConnected")).status_code == 299


async def test_nothing_served_when_upstream_is_up(tmp_path: Path) -> None:
    async with offline_app(tmp_path, upstream_ok=True) as client:
        resp = await client.post("/aiserver.v1.NetworkService/IsConnected", content=b"")
        assert (resp.status_code, resp.content) == (299, b"forwarded")
        assert (await client.get("/auth/stripe_profile")).status_code == 299


def test_matches() -> None:
    assert OfflineAnswers.matches(
        {"type": "http", "method": "POST", "path": "/aiserver.v1.NetworkService/IsConnected"}
    )
    assert not OfflineAnswers.matches({"type": "http", "method": "POST", "path": "/x"})
    assert not OfflineAnswers.matches(
        {"type": "websocket", "path": "/aiserver.v1.NetworkService/IsConnected"}
    )


# --- UpstreamHealth ----------------------------------------------------------------------


async def test_health_reachable_and_cached() -> None:
    hits: list[str] = []

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        hits.append(scope["method"])
        await send({"type": "http.response.start", "status": 404, "headers": []})  # any status counts
        await send({"type": "http.response.body", "body": b""})

    async with trio.open_nursery() as nursery, httpx.AsyncClient() as client:
        url, stop = await serve_app(upstream, host="127.0.0.1", port=0, nursery=nursery)
        health = UpstreamHealth(url, client, ttl_s=60)
        async with trio.open_nursery() as callers:
            for _ in range(5):
                callers.start_soon(health.reachable)
        assert await health.reachable() is True
        assert health.probes == 1 and hits == ["HEAD"]
        health.note(False)  # real traffic just failed
        assert await health.reachable() is False
        assert health.probes == 1
        stop()


# The probe's own deadlines, without sockets: an ``httpx.MockTransport`` under
# MockClock(autojump_threshold=0) (pytest-trio's ``autojump_clock``), so every wait below is
# virtual and measured exactly.

HARD_CAP_SLACK_S = 0.5  # UpstreamHealth._probe: move_on_after(timeout_s + 0.5) behind httpx's timeout


def mock_client(handler: Callable[[httpx.Request], Awaitable[httpx.Response]]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


async def test_health_unreachable_and_expiry(autojump_clock: trio.testing.MockClock) -> None:
    answers: list[Callable[[httpx.Request], Awaitable[httpx.Response]]] = [_refused]
    probed_at: list[float] = []

    async def upstream(request: httpx.Request) -> httpx.Response:
        probed_at.append(trio.current_time())
        return await answers[-1](request)

    async def up(request: httpx.Request) -> httpx.Response:
        await trio.sleep(1.0)  # a slow answer: the cache runs from the probe's end
        return httpx.Response(503)

    async with mock_client(upstream) as client:
        health = UpstreamHealth("http://upstream.invalid", client, ttl_s=5.0, timeout_s=2.0)
        t0 = trio.current_time()
        assert await health.reachable() is False  # a transport error: unreachable
        assert (health.probes, probed_at) == (1, [t0])
        answers.append(up)  # upstream comes back; the cached "unreachable" still stands...
        await trio.sleep_until(t0 + 5.0 - 0.001)
        assert await health.reachable() is False
        assert health.probes == 1
        await trio.sleep_until(t0 + 5.0)  # ...until exactly its TTL
        assert await health.reachable() is True
        assert (health.probes, probed_at) == (2, [t0, t0 + 5.0])
        assert trio.current_time() == t0 + 6.0  # the answer came after its 1 s delay
        await trio.sleep_until(t0 + 11.0 - 0.001)  # TTL counted from when that answer arrived
        assert await health.reachable() is True
        assert health.probes == 2
        await trio.sleep_until(t0 + 11.0)
        assert await health.reachable() is True
        assert (health.probes, probed_at) == (3, [t0, t0 + 5.0, t0 + 11.0])


async def test_health_timeout(autojump_clock: trio.testing.MockClock) -> None:
    # An upstream that accepts the request and never answers. The transport raises ReadTimeout
    # when the timeout the probe passed runs out, as httpx's network transports do.
    seen: list[dict[str, float]] = []

    async def silent(request: httpx.Request) -> httpx.Response:
        timeout = request.extensions["timeout"]
        seen.append(timeout)
        await trio.sleep(timeout["read"])
        raise httpx.ReadTimeout("no answer", request=request)

    async with mock_client(silent) as client:  # the client's own default timeout is 5 s
        health = UpstreamHealth("http://upstream.invalid", client, timeout_s=0.2)
        t0 = trio.current_time()
        assert await health.reachable() is False
        assert trio.current_time() - t0 == 0.2
        assert seen == [{"connect": 0.2, "read": 0.2, "write": 0.2, "pool": 0.2}]


async def test_health_timeout_hard_cap(autojump_clock: trio.testing.MockClock) -> None:
    # A transport that ignores every timeout (a wedged proxy, say): the probe still gives up,
    # at its hard cap, and a later probe runs normally.
    async def wedged(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError

    async with mock_client(wedged) as client:
        health = UpstreamHealth("http://upstream.invalid", client, ttl_s=5.0, timeout_s=2.0)
        t0 = trio.current_time()
        with trio.fail_after(3600):  # virtual: a probe without a cap fails here instead of hanging
            assert await health.reachable() is False
        assert trio.current_time() - t0 == 2.0 + HARD_CAP_SLACK_S
        assert health.probes == 1


async def test_health_answer_within_the_timeout(autojump_clock: trio.testing.MockClock) -> None:
    # An answer that takes almost the whole timeout still counts (any status: something answered).
    async def slow(request: httpx.Request) -> httpx.Response:
        await trio.sleep(request.extensions["timeout"]["read"] - 0.001)
        return httpx.Response(404)

    async with mock_client(slow) as client:
        health = UpstreamHealth("http://upstream.invalid", client, timeout_s=2.0)
        t0 = trio.current_time()
        assert await health.reachable() is True
        assert trio.current_time() - t0 == 2.0 - 0.001
