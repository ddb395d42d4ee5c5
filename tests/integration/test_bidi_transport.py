"""RunSSE/BidiAppend transport: ordering, heartbeats, and every bad input answered with the right code."""

from __future__ import annotations

import gzip

import httpx
import pytest
import trio

from byok.devtools.cursor_sim import RUN_SSE, CursorSim, Transcript, user_turn
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script

BIDI = "/aiserver.v1.BidiService/BidiAppend"


def run_request(conv: str = "c-t", model: str = "byok-demo") -> agent.AgentRunRequest:
    return user_turn("hi", conversation_id=conv, model_id=model, message_id="m1")


def append_body(rid: str, seqno: int, data: str) -> bytes:
    return bytes(
        aiserver.BidiAppendRequest(
            data=data, request_id=aiserver.BidiRequestId(request_id=rid), append_seqno=seqno
        )
    )


async def post_append(d: Daemon, body: bytes, **headers: str) -> httpx.Response:
    return await d.client.post(
        d.base_url + BIDI, content=body, headers={"content-type": "application/proto", **headers}
    )


def hexmsg(msg: agent.AgentClientMessage) -> str:
    return bytes(msg).hex()


async def read_run(d: Daemon, rid: str, tr: Transcript) -> None:
    body = encode_frame(bytes(aiserver.BidiRequestId(request_id=rid)))
    async with d.client.stream(
        "POST", d.base_url + RUN_SSE, content=body, headers={"content-type": "application/connect+proto"}
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/connect+proto"
        dec = FrameDecoder()
        async for chunk in resp.aiter_bytes():
            for f in dec.feed(chunk):
                if f.end_stream:
                    import json

                    tr.end_stream = json.loads(f.payload)
                    return
                from byok.devtools.cursor_sim import Recorded, frame_kind

                msg = agent.AgentServerMessage.parse(f.payload)
                tr.frames.append(Recorded(msg, frame_kind(msg), frozenset()))


async def test_appends_before_runsse_and_out_of_order(daemon: Daemon) -> None:
    """The run_request arrives before RunSSE; seqno 1 (a heartbeat) arrives before seqno 0."""
    daemon.provider.enqueue(chat_text_script(["ok"], delay_s=0.05))
    rid = "req-order"
    hb = agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())
    r1 = await post_append(daemon, append_body(rid, 1, hexmsg(hb)))
    assert r1.status_code == 200  # buffered, answered at once
    r0 = await post_append(
        daemon, append_body(rid, 0, hexmsg(agent.AgentClientMessage(run_request=run_request())))
    )
    assert r0.status_code == 200 and r0.content == b""
    # Duplicates are dropped idempotently.
    assert (await post_append(daemon, append_body(rid, 1, hexmsg(hb)))).status_code == 200
    tr = Transcript()
    # KV SETs must be answered for the run to finish: use the simulator's auto-reply via a manual loop.
    sim = CursorSim(daemon.base_url, daemon.client)
    seq = 2
    async with trio.open_nursery() as nursery:

        async def ack_loop() -> None:
            nonlocal seq
            seen = 0
            while tr.end_stream is None:
                await trio.sleep(0.01)
                while seen < len(tr.frames):  # frames keep arriving while we append
                    rec = tr.frames[seen]
                    seen += 1
                    for reply in sim.auto_reply(rec.message, set()):
                        await sim.append(rid, seq, reply)
                        seq += 1

        nursery.start_soon(ack_loop)
        await read_run(daemon, rid, tr)
    assert tr.end_stream == {}
    assert "interaction_update.heartbeat" in [f.kind for f in tr.frames]
    assert tr.text() == "ok"


async def test_client_heartbeat_is_answered(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["a", "b"], delay_s=0.2))
    sent = False

    def on_frame(rec, tr):  # type: ignore[no-untyped-def]
        nonlocal sent
        if rec.kind == "interaction_update.text_delta" and not sent:
            sent = True
            return [agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())]
        return []

    tr = await daemon.sim.run("req-hb", run_request(), on_frame=on_frame)
    assert tr.end_stream == {}
    kinds = [f.kind for f in tr.frames]
    first_text = kinds.index("interaction_update.text_delta")
    assert "interaction_update.heartbeat" in kinds[first_text:]


async def test_idle_runsse_gets_heartbeats(tmp_path, nursery) -> None:  # type: ignore[no-untyped-def]
    from byok.config_load import load_config
    from byok.daemon import run_daemon
    from tests.integration.conftest import write_config
    from tests.support.fake_provider import FakeProvider

    provider = FakeProvider()
    url = await provider.start(nursery)
    cfg = tmp_path / "c.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "d")
    cfg.write_text(
        cfg.read_text().replace("kv_ack_timeout_s = 5.0", "kv_ack_timeout_s = 5.0\nheartbeat_s = 0.05")
    )
    base, shutdown = await nursery.start(run_daemon, load_config(cfg, overrides={}))
    provider.enqueue(chat_text_script(["slow"], delay_s=0.3))
    async with httpx.AsyncClient(timeout=30) as client:
        tr = await CursorSim(base, client).run("req-idle", run_request())
    shutdown()
    assert tr.end_stream == {}
    kinds = [f.kind for f in tr.frames]
    assert kinds.count("interaction_update.heartbeat") >= 2
    assert kinds.index("interaction_update.heartbeat") < kinds.index("interaction_update.text_delta")


async def test_runsse_accepts_raw_and_gzip_bodies(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["x"]))
    rid = "req-raw"
    raw = bytes(aiserver.BidiRequestId(request_id=rid))
    sim = daemon.sim
    tr = Transcript()
    async with trio.open_nursery() as nursery:

        async def stream() -> None:
            async with daemon.client.stream(
                "POST",
                daemon.base_url + RUN_SSE,
                content=gzip.compress(raw),
                headers={"content-type": "application/proto", "content-encoding": "gzip"},
            ) as resp:
                dec = FrameDecoder()
                async for chunk in resp.aiter_bytes():
                    for f in dec.feed(chunk):
                        if f.end_stream:
                            tr.end_stream = {"raw": f.payload.decode()}
                            return
                        msg = agent.AgentServerMessage.parse(f.payload)
                        for reply in sim.auto_reply(msg, set()):
                            tr.appends.append((len(tr.appends) + 1, "kv"))
                            await sim.append(rid, len(tr.appends), reply)

        nursery.start_soon(stream)
        await trio.sleep(0.05)
        await sim.append(rid, 0, agent.AgentClientMessage(run_request=run_request("c-raw")))
    assert tr.end_stream == {"raw": "{}"}


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        ("undecodable", 400, "invalid_argument"),
        ("no_request_id", 400, "invalid_argument"),
        ("first_not_run_request", 400, "invalid_argument"),
        # Not a byok model: relayed to upstream, which is unreachable in this fixture.
        ("unknown_model", 502, "unavailable"),
        ("no_model", 400, "invalid_argument"),
        ("oversized", 429, "resource_exhausted"),
    ],
)
async def test_bad_appends(daemon: Daemon, case: str, status: int, code: str) -> None:
    hb = agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())
    if case == "undecodable":
        body = b"\xff\xff\xff"
    elif case == "no_request_id":
        body = bytes(aiserver.BidiAppendRequest(data=hexmsg(hb), append_seqno=0))
    elif case == "first_not_run_request":
        body = append_body("r-first", 0, hexmsg(hb))
    elif case == "unknown_model":
        body = append_body(
            "r-model", 0, hexmsg(agent.AgentClientMessage(run_request=run_request(model="nope")))
        )
    elif case == "no_model":
        req = run_request()
        req.requested_model = None
        body = append_body("r-nomodel", 0, hexmsg(agent.AgentClientMessage(run_request=req)))
    else:
        body = append_body("r-big", 0, "00" * (40 * 1024 * 1024))
    resp = await post_append(daemon, body)
    assert resp.status_code == status
    assert resp.json()["code"] == code


async def test_malformed_data_on_an_agent_request_does_not_disturb_the_run(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["fine"], delay_s=0.1))
    bad_sent: list[int] = []

    def on_frame(rec, tr):  # type: ignore[no-untyped-def]
        return []

    async def poke() -> None:
        await trio.sleep(0.05)
        resp = await post_append(daemon, append_body("req-bad", 1, "zz-not-hex"))
        bad_sent.append(resp.status_code)
        assert resp.json()["code"] == "invalid_argument"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poke)
        tr = await daemon.sim.run("req-bad", run_request(), on_frame=on_frame)
    assert bad_sent == [400]
    # The bad append did not consume seqno 1: the simulator's later appends (ACKs from seqno 1) worked.
    assert tr.end_stream == {}


async def test_runsse_without_request_id_ends_with_error(daemon: Daemon) -> None:
    resp = await daemon.client.post(
        daemon.base_url + RUN_SSE,
        content=encode_frame(bytes(aiserver.BidiRequestId())),
        headers={"content-type": "application/connect+proto"},
    )
    assert resp.status_code == 200
    frames = FrameDecoder().feed(resp.content)
    assert len(frames) == 1 and frames[0].end_stream
    assert b"invalid_argument" in frames[0].payload


async def test_a_relayed_run_with_upstream_down_ends_the_open_runsse(daemon: Daemon) -> None:
    rid = "req-um"
    result = Transcript()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_run, daemon, rid, result)
        await trio.sleep(0.05)
        body = append_body(rid, 0, hexmsg(agent.AgentClientMessage(run_request=run_request(model="nope"))))
        assert (await post_append(daemon, body)).status_code == 502
    assert result.error is not None and result.error["code"] == "unavailable"
    assert "upstream unreachable" in result.error["message"]


async def test_healthz(daemon: Daemon) -> None:
    resp = await daemon.client.get(daemon.base_url + "/byok/healthz")
    assert resp.status_code == 200
    assert resp.json()["status"] == "ok"
    assert resp.json()["models"] == ["byok-demo"]


async def test_runsse_over_h2c(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["over h2"]))
    async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as h2:
        tr = await CursorSim(daemon.base_url, h2).run("req-h2", run_request("c-h2"))
        resp = await h2.get(daemon.base_url + "/byok/healthz")
        assert resp.http_version == "HTTP/2"
    assert tr.end_stream == {} and tr.text() == "over h2"
