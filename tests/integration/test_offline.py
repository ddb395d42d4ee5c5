"""OfflineAnswers (served only when upstream is down) and the UpstreamHealth probe."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

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


async def test_health_unreachable_and_expiry() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    async with httpx.AsyncClient() as client:
        health = UpstreamHealth(f"http://127.0.0.1:{port}", client, ttl_s=0.05, timeout_s=1)
        with trio.fail_after(5):
            assert await health.reachable() is False
            await trio.sleep(0.1)
            assert await health.reachable() is False
        assert health.probes == 2


async def test_health_timeout() -> None:
    # A listener that accepts but never answers: the probe gives up after its timeout.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with httpx.AsyncClient() as client:
        health = UpstreamHealth(f"http://127.0.0.1:{port}", client, timeout_s=0.2)
        with trio.fail_after(5):
            assert await health.reachable() is False
    await listeners[0].aclose()
