"""The HTTP/2 `agent.v1.AgentService/Run` bidi call runs on the same machinery as RunSSE +
BidiAppend: frames from the request body are numbered from 0, like BidiAppend seqnos."""

from __future__ import annotations

import json

import httpx

from byok.devtools.cursor_sim import CursorSim, user_turn
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.pb.agent import v1 as agent
from tests.integration.conftest import Daemon
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
