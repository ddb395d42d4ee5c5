"""Runs for models that are not byok's go to upstream whole: RunSSE and every BidiAppend of
that request id, unchanged. Other RPCs sharing BidiAppend (speech-to-text) are relayed too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from byok.devtools.cursor_sim import user_turn
from byok.http.connect_envelope import encode_frame, end_stream_ok
from byok.http.serve import Receive, Scope, Send, serve_app
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from tests.integration.conftest import Daemon, start_daemon


@attrs.define
class FakeUpstream:
    """Cursor's backend, as far as a relayed run needs it."""

    seen: list[tuple[str, bytes]] = attrs.Factory(list)
    runsse_status: int = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        self.seen.append((scope["path"], body))
        if scope["path"].endswith("/RunSSE"):
            if self.runsse_status != 200:
                await send({"type": "http.response.start", "status": self.runsse_status, "headers": []})
                await send({"type": "http.response.body", "body": b'{"code":"unauthenticated"}'})
                return
            frame = encode_frame(
                bytes(
                    agent.AgentServerMessage(
                        interaction_update=agent.InteractionUpdate(
                            text_delta=agent.TextDeltaUpdate(text="from upstream")
                        )
                    )
                )
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/connect+proto")],
                }
            )
            # Answer only once the run_request reached upstream, like the real backend.
            with trio.fail_after(5):
                while not any(p.endswith("/BidiAppend") for p, _ in self.seen):
                    await trio.sleep(0.01)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": end_stream_ok(), "more_body": False})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/proto")],
            }
        )
        await send({"type": "http.response.body", "body": b""})


@attrs.define
class Rig:
    daemon: Daemon
    upstream: FakeUpstream


@pytest.fixture
async def rig(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Rig]:
    upstream = FakeUpstream()
    url, stop = await serve_app(upstream, host="127.0.0.1", port=0, nursery=nursery)
    async with start_daemon(tmp_path, nursery, upstream=url) as d:
        yield Rig(d, upstream)
    stop()


def official(conv: str = "c-off") -> agent.AgentRunRequest:
    return user_turn("hello", conversation_id=conv, model_id="claude-official", message_id="m1")


@pytest.mark.parametrize("sse_first", [True, False])
async def test_official_model_run_is_relayed_whole(rig: Rig, sse_first: bool) -> None:
    tr = await rig.daemon.sim.run("req-off", official(), sse_first=sse_first)
    assert tr.end_stream == {}
    assert tr.text() == "from upstream"
    paths = [p for p, _ in rig.upstream.seen]
    assert "/agent.v1.AgentService/RunSSE" in paths
    appends = [b for p, b in rig.upstream.seen if p.endswith("/BidiAppend")]
    (first,) = appends
    req = aiserver.BidiAppendRequest.parse(first)
    assert req.append_seqno == 0 and req.request_id.request_id == "req-off"
    relayed = agent.AgentClientMessage.parse(bytes.fromhex(req.data))
    assert relayed.run_request is not None
    assert relayed.run_request.requested_model.model_id == "claude-official"
    assert rig.daemon.provider.requests == []  # byok's provider never saw it


async def test_later_appends_of_a_relayed_run_are_relayed(rig: Rig) -> None:
    sim = rig.daemon.sim
    assert (
        await sim.append("req-r2", 0, agent.AgentClientMessage(run_request=official("c2")))
    ).status_code == 200
    hb = agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())
    assert (await sim.append("req-r2", 1, hb)).status_code == 200
    bodies = [aiserver.BidiAppendRequest.parse(b) for p, b in rig.upstream.seen if p.endswith("/BidiAppend")]
    assert [b.append_seqno for b in bodies] == [0, 1]


async def test_non_agent_bidi_append_goes_upstream(rig: Rig) -> None:
    body = bytes(
        aiserver.BidiAppendRequest(
            data="not hex: audio", request_id=aiserver.BidiRequestId(request_id="stt-1"), append_seqno=0
        )
    )
    d = rig.daemon
    for _ in range(2):
        resp = await d.client.post(
            d.base_url + "/aiserver.v1.BidiService/BidiAppend",
            content=body,
            headers={"content-type": "application/proto"},
        )
        assert resp.status_code == 200
    assert [b for p, b in rig.upstream.seen if p.endswith("/BidiAppend")] == [body, body]


async def test_upstream_refusing_the_runsse_becomes_a_stream_error(rig: Rig) -> None:
    rig.upstream.runsse_status = 401
    tr = await rig.daemon.sim.run("req-401", official("c3"))
    assert tr.error is not None and tr.error["code"] == "unauthenticated"


async def test_byok_model_still_runs_locally(rig: Rig) -> None:
    from tests.support.fake_provider import chat_text_script

    rig.daemon.provider.enqueue(chat_text_script(["local answer"]))
    tr = await rig.daemon.sim.run(
        "req-local", user_turn("hi", conversation_id="c-l", model_id="byok-demo", message_id="m")
    )
    assert tr.end_stream == {} and tr.text() == "local answer"
    assert not any(p.endswith("/RunSSE") for p, _ in rig.upstream.seen)
