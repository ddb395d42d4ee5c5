"""The HTTP/2 `agent.v1.AgentService/Run` bidi call runs on the same machinery as RunSSE +
BidiAppend: frames from the request body are numbered from 0, like BidiAppend seqnos. A Run for
a model byok does not serve is relayed to upstream over HTTP/2, full duplex."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, user_turn
from byok.http.connect_envelope import Frame, FrameDecoder, encode_frame, end_stream_ok
from byok.http.h2_call import h2_call
from byok.http.serve import Receive, Scope, Send, serve_app
from byok.pb.agent import v1 as agent
from tests.integration.conftest import Daemon, start_daemon
from tests.support.fake_provider import chat_text_script


async def test_run_over_http2(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["over ", "h2 bidi"]))
    run_request = user_turn("hi", conversation_id="c-h2", model_id="byok-demo", message_id="m1")
    body = encode_frame(bytes(agent.AgentClientMessage(run_request=run_request)))
    texts: list[str] = []
    end: dict | None = None  # type: ignore[type-arg]
    async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as h2:
        # KV ACKs travel as BidiAppends on the same request id, continuing the frame numbering.
        acker = CursorSim(daemon.base_url, h2)
        seq = 1
        async with h2.stream(
            "POST",
            daemon.base_url + "/agent.v1.AgentService/Run",
            content=body,
            headers={"content-type": "application/connect+proto", "x-request-id": "req-h2-run"},
        ) as resp:
            assert resp.http_version == "HTTP/2"
            assert resp.status_code == 200
            decoder = FrameDecoder()
            async for chunk in resp.aiter_bytes():
                for frame in decoder.feed(chunk):
                    if frame.end_stream:
                        end = json.loads(frame.payload)
                        break
                    msg = agent.AgentServerMessage.parse(frame.payload)
                    if msg.interaction_update is not None and msg.interaction_update.text_delta is not None:
                        texts.append(msg.interaction_update.text_delta.text)
                    for reply in acker.auto_reply(msg, set()):
                        r = await acker.append("req-h2-run", seq, reply)
                        assert r.status_code == 200
                        seq += 1
                if end is not None:
                    break
    assert end == {}
    assert "".join(texts) == "over h2 bidi"
    assert seq > 1  # blobs were SET and ACKed before the checkpoints


# --- relayed Runs ------------------------------------------------------------------------

RUN = "/agent.v1.AgentService/Run"


def _text(text: str) -> bytes:
    msg = agent.AgentServerMessage(
        interaction_update=agent.InteractionUpdate(text_delta=agent.TextDeltaUpdate(text=text))
    )
    return encode_frame(bytes(msg))


@attrs.define
class DuplexUpstream:
    """Cursor's backend for a Run: answers each client frame as it arrives, before the next."""

    seen: list[tuple[Scope, list[agent.AgentClientMessage]]] = attrs.Factory(list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        got: list[agent.AgentClientMessage] = []
        self.seen.append((scope, got))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/connect+proto"), (b"x-upstream", b"yes")],
            }
        )
        decoder = FrameDecoder()
        more = True
        while more:
            event = await receive()
            if event["type"] == "http.disconnect":
                return
            more = bool(event.get("more_body"))
            for frame in decoder.feed(event.get("body", b"")):
                got.append(agent.AgentClientMessage.parse(frame.payload))
                await send(
                    {"type": "http.response.body", "body": _text(f"got {len(got)}"), "more_body": True}
                )
        await send({"type": "http.response.body", "body": end_stream_ok(), "more_body": False})


async def _read_frame(chunks: AsyncIterator[bytes], decoder: FrameDecoder, pending: list[Frame]) -> Frame:
    while not pending:
        pending += decoder.feed(await anext(chunks))
    return pending.pop(0)


def _text_of(frame: Frame) -> str:
    msg = agent.AgentServerMessage.parse(frame.payload)
    assert msg.interaction_update is not None and msg.interaction_update.text_delta is not None
    return msg.interaction_update.text_delta.text


@pytest.mark.parametrize("model", ["claude-official", "byok-off"])
async def test_a_run_byok_does_not_serve_is_relayed_full_duplex(
    tmp_path: Path, nursery: trio.Nursery, model: str
) -> None:
    upstream = DuplexUpstream()
    url, stop = await serve_app(upstream, host="127.0.0.1", port=0, nursery=nursery)
    disabled = '[[models]]\nid = "byok-off"\nprovider = "fake"\nupstream_model = "x"\ncontext_tokens = 1\n'
    disabled = "\n" + disabled + "enabled = false\n"
    async with start_daemon(tmp_path, nursery, upstream=url, extra=disabled) as d:
        run = user_turn("hi", conversation_id="c-h2-off", model_id=model, message_id="m1")
        headers = [
            (b"content-type", b"application/connect+proto"),
            (b"x-request-id", b"req-h2-off"),
            (b"authorization", b"Bearer cursor-session"),
        ]
        with trio.fail_after(10):
            async with h2_call(httpx.URL(d.base_url + RUN), headers) as call:
                # One frame at a time, each answered before the next is sent: a relay that
                # waited for the whole request body would never answer the first.
                await call.send(encode_frame(bytes(agent.AgentClientMessage(run_request=run))))
                status, got_headers = await call.response()
                assert status == 200 and (b"x-upstream", b"yes") in got_headers
                chunks, decoder, pending = aiter(call.body()), FrameDecoder(), []
                assert _text_of(await _read_frame(chunks, decoder, pending)) == "got 1"
                heartbeat = agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())
                await call.send(encode_frame(bytes(heartbeat)))
                assert _text_of(await _read_frame(chunks, decoder, pending)) == "got 2"
                await call.end()
                end = await _read_frame(chunks, decoder, pending)
                assert end.end_stream and end.payload == b"{}"
    stop()
    ((scope, messages),) = upstream.seen
    assert scope["http_version"] == "2" and scope["path"] == RUN
    sent = dict(scope["headers"])
    assert (sent[b"x-request-id"], sent[b"authorization"]) == (b"req-h2-off", b"Bearer cursor-session")
    assert messages[0].run_request is not None and messages[0].run_request.requested_model.model_id == model
    assert messages[1].client_heartbeat is not None
    assert d.provider.requests == []  # byok's provider never saw it


async def test_a_relayed_run_with_upstream_down(tmp_path: Path, nursery: trio.Nursery) -> None:
    async with start_daemon(tmp_path, nursery, upstream="http://127.0.0.1:9") as d:
        run = user_turn("hi", conversation_id="c-h2-down", model_id="claude-official", message_id="m1")
        async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as h2:
            resp = await h2.post(
                d.base_url + RUN,
                content=encode_frame(bytes(agent.AgentClientMessage(run_request=run))),
                headers={"content-type": "application/connect+proto", "x-request-id": "req-h2-down"},
            )
    (frame,) = FrameDecoder().feed(resp.content)
    assert resp.status_code == 200 and frame.end_stream
    error = json.loads(frame.payload)["error"]
    assert error["code"] == "unavailable" and "upstream unreachable" in error["message"]


async def test_a_run_that_sends_no_run_request(daemon: Daemon) -> None:
    async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as h2:
        resp = await h2.post(
            daemon.base_url + RUN, content=b"", headers={"content-type": "application/connect+proto"}
        )
    (frame,) = FrameDecoder().feed(resp.content)
    assert json.loads(frame.payload)["error"]["code"] == "invalid_argument"
