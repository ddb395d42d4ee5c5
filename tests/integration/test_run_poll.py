"""RunPoll: Cursor with HTTP/1.1 SSE off reads a run's frames by polling, on the same machinery
as RunSSE (client messages as BidiAppends); a relayed run's polls go upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, user_turn
from byok.http.connect_envelope import FrameDecoder, encode_frame, end_stream_ok
from byok.http.run_poll import PollCursor, poll_frame
from byok.http.serve import Receive, Scope, Send, serve_app
from byok.loop.turn_values import Failed, Succeeded
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from tests.integration.conftest import Daemon, start_daemon
from tests.support.fake_provider import chat_text_script, error_script

RUN_POLL = "/agent.v1.AgentService/RunPoll"
CONNECT = {"content-type": "application/connect+proto", "connect-protocol-version": "1"}


@attrs.define
class Poll:
    responses: list[aiserver.BidiPollResponse]
    end: dict[str, Any] | None  # the Connect end-stream, None when the answer stopped short


async def poll(client: httpx.AsyncClient, base: str, rid: str, *, start: bool | None = None) -> Poll:
    req = aiserver.BidiPollRequest(request_id=aiserver.BidiRequestId(request_id=rid), start_request=start)
    resp = await client.post(base + RUN_POLL, content=encode_frame(bytes(req)), headers=CONNECT)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/connect+proto"
    out = Poll([], None)
    for frame in FrameDecoder().feed(resp.content):
        if frame.end_stream:
            out.end = json.loads(frame.payload)
        else:
            out.responses.append(aiserver.BidiPollResponse.parse(frame.payload))
    return out


@attrs.define
class Polled:
    frames: list[agent.AgentServerMessage] = attrs.Factory(list)
    seqnos: list[int] = attrs.Factory(list)
    polls: int = 0
    eof: bool = False
    end: dict[str, Any] | None = None

    def text(self) -> str:
        return "".join(
            f.interaction_update.text_delta.text
            for f in self.frames
            if f.interaction_update is not None and f.interaction_update.text_delta is not None
        )


async def drive(sim: CursorSim, rid: str, run_request: agent.AgentRunRequest) -> Polled:
    """Cursor's poll loop: the run_request as append 0, then polls until the end, each KV SET
    or GET answered by the next append, awaited, before the next poll."""
    out = Polled()
    seq = 0
    assert (await sim.append(rid, seq, agent.AgentClientMessage(run_request=run_request))).status_code == 200
    seq += 1
    with trio.fail_after(30):
        while out.end is None:
            got = await poll(sim.client, sim.base_url, rid, start=out.polls == 0)
            out.polls += 1
            assert got.end is not None, "every poll's answer ends with an end-stream"
            for r in got.responses:
                if r.eof:
                    out.eof = True
                    continue
                msg = agent.AgentServerMessage.parse(bytes.fromhex(r.data))
                out.seqnos.append(r.seqno)
                out.frames.append(msg)
                for reply in sim.auto_reply(msg):
                    assert (await sim.append(rid, seq, reply)).status_code == 200
                    seq += 1
            if got.end != {} or out.eof:
                out.end = got.end
    return out


async def test_a_run_read_by_polls(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["read ", "by ", "polls"]))
    run = user_turn("hi", conversation_id="c-poll", model_id="byok-demo", message_id="m1")
    got = await drive(daemon.sim, "req-poll", run)
    assert got.text() == "read by polls"
    assert (got.eof, got.end) == (True, {})
    assert got.seqnos == list(range(len(got.seqnos)))  # the run's frames, numbered across polls
    assert got.polls > 1
    assert any(f.conversation_checkpoint_update is not None for f in got.frames)
    # The run is over: a later poll gets the same end again, not a wait.
    again = await poll(daemon.client, daemon.base_url, "req-poll")
    assert [(r.eof, r.data) for r in again.responses] == [(True, "")]
    assert again.end == {}


async def test_a_failed_run_ends_its_poll_with_the_error(daemon: Daemon) -> None:
    daemon.provider.enqueue(error_script(400, "bad request"))
    run = user_turn("hi", conversation_id="c-poll-err", model_id="byok-demo", message_id="m1")
    got = await drive(daemon.sim, "req-poll-err", run)
    assert not got.eof
    assert got.end is not None and got.end["error"]["code"] == "unavailable"
    assert "bad request" in got.end["error"]["message"]


async def test_a_poll_for_an_unknown_run(daemon: Daemon) -> None:
    got = await poll(daemon.client, daemon.base_url, "req-never", start=False)
    assert got.responses == []
    assert got.end is not None and got.end["error"]["code"] == "not_found"
    bad = await daemon.client.post(
        daemon.base_url + RUN_POLL, content=encode_frame(b"\xff\xff"), headers=CONNECT
    )
    assert json.loads(FrameDecoder().feed(bad.content)[-1].payload)["error"]["code"] == "invalid_argument"


async def test_quiet_polls_get_heartbeats(tmp_path: Path, nursery: trio.Nursery) -> None:
    async with start_daemon(tmp_path, nursery, server_extra="heartbeat_s = 0.2") as d:
        d.provider.enqueue(chat_text_script(["slow"], delay_s=0.5))
        run = user_turn("hi", conversation_id="c-poll-hb", model_id="byok-demo", message_id="m1")
        got = await drive(d.sim, "req-poll-hb", run)
    assert got.text() == "slow"
    beats = [
        f
        for f in got.frames
        if f.interaction_update is not None and f.interaction_update.heartbeat is not None
    ]
    assert beats  # polls that found nothing answered within heartbeat_s
    assert got.seqnos == list(range(len(got.seqnos)))


async def test_a_poll_whose_client_left_takes_nothing(daemon: Daemon) -> None:
    """A poll abandoned while it waited loses no frame: the next poll starts at seqno 0."""
    daemon.provider.enqueue(chat_text_script(["kept"], delay_s=0.3))
    rid = "req-poll-left"
    run = user_turn("hi", conversation_id="c-poll-left", model_id="byok-demo", message_id="m1")
    assert (await daemon.sim.append(rid, 0, agent.AgentClientMessage(run_request=run))).status_code == 200
    with trio.move_on_after(0.1):  # the poll waits for the first frame; its client gives up
        await poll(daemon.client, daemon.base_url, rid, start=True)
    first = await poll(daemon.client, daemon.base_url, rid)
    assert first.responses[0].seqno == 0


def test_cursor_sends_a_lost_answer_again() -> None:
    """PollCursor: an answer that did not go out whole is the next poll's, with its seqnos."""
    c = PollCursor()
    assert c.resend() is None
    first = c.take([b"a", b"b"])
    assert first == poll_frame(0, b"a") + poll_frame(1, b"b") + end_stream_ok()
    assert c.resend() == first  # not delivered: the same frames again
    c.delivered = True
    assert c.resend() is None
    assert c.take([b"c", Succeeded()]) == poll_frame(2, b"c") + poll_frame(3, eof=True) + end_stream_ok()
    c.delivered = True
    assert c.resend() == poll_frame(3, eof=True) + end_stream_ok()  # the end, to every later poll
    failed = PollCursor()
    failed.take([Failed("unavailable", "down")])
    assert b'"unavailable"' in (failed.resend() or b"")


# --- relayed runs --------------------------------------------------------------------------


@attrs.define
class PollUpstream:
    seen: list[tuple[str, bytes]] = attrs.Factory(list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        self.seen.append((scope["path"], body))
        if scope["path"] == RUN_POLL:
            text = agent.AgentServerMessage(
                interaction_update=agent.InteractionUpdate(text_delta=agent.TextDeltaUpdate(text="upstream"))
            )
            out = poll_frame(0, bytes(text)) + poll_frame(1, eof=True) + end_stream_ok()
            ctype = b"application/connect+proto"
        else:
            out, ctype = b"", b"application/proto"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": out})


@pytest.fixture
async def relay(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[tuple[Daemon, PollUpstream]]:
    upstream = PollUpstream()
    url, stop = await serve_app(upstream, host="127.0.0.1", port=0, nursery=nursery)
    async with start_daemon(tmp_path, nursery, upstream=url) as d:
        yield d, upstream
    stop()


async def test_an_official_models_polls_go_upstream(relay: tuple[Daemon, PollUpstream]) -> None:
    d, upstream = relay
    run = user_turn("hi", conversation_id="c-poll-off", model_id="claude-official", message_id="m1")
    got = await drive(d.sim, "req-poll-off", run)
    assert (got.text(), got.eof, got.end) == ("upstream", True, {})
    polls = [body for path, body in upstream.seen if path == RUN_POLL]
    assert polls, "the poll reached upstream"
    (frame,) = FrameDecoder().feed(polls[0])
    relayed = aiserver.BidiPollRequest.parse(frame.payload)
    assert relayed.request_id is not None and relayed.request_id.request_id == "req-poll-off"
    assert d.provider.requests == []


async def test_the_first_poll_may_come_before_the_run_request(daemon: Daemon, nursery: trio.Nursery) -> None:
    daemon.provider.enqueue(chat_text_script(["after ", "the poll"]))
    rid = "req-poll-early"
    first: list[Poll] = []

    async def early_poll() -> None:
        first.append(await poll(daemon.client, daemon.base_url, rid, start=True))

    nursery.start_soon(early_poll)
    await trio.sleep(0.05)  # the poll waits for the run_request that decides the run
    run = user_turn("hi", conversation_id="c-poll-early", model_id="byok-demo", message_id="m1")
    assert (await daemon.sim.append(rid, 0, agent.AgentClientMessage(run_request=run))).status_code == 200
    with trio.fail_after(10):
        while not first:
            await trio.sleep(0.01)
    assert first[0].end == {} and first[0].responses[0].seqno == 0
    # The rest of the run, by the usual loop (its KV answers continue the append numbering).
    seq, texts, eof = 1, [], False
    pending = first[0].responses
    with trio.fail_after(20):
        while not eof:
            for r in pending:
                if r.eof:
                    eof = True
                    continue
                msg = agent.AgentServerMessage.parse(bytes.fromhex(r.data))
                if msg.interaction_update is not None and msg.interaction_update.text_delta is not None:
                    texts.append(msg.interaction_update.text_delta.text)
                for reply in daemon.sim.auto_reply(msg):
                    assert (await daemon.sim.append(rid, seq, reply)).status_code == 200
                    seq += 1
            if not eof:
                pending = (await poll(daemon.client, daemon.base_url, rid)).responses
    assert "".join(texts) == "after the poll"
