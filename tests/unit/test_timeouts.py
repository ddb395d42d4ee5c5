"""Every run timeout under a MockClock with autojump: KV ACK/GET waits, the RunSSE reconnect
grace, heartbeats and the shutdown deadline. Requesting pytest-trio's ``autojump_clock``
fixture runs the test on MockClock(autojump_threshold=0): virtual time jumps whenever every task
is blocked, so nothing really sleeps and ``trio.current_time()`` measures waits exactly.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

from byok.config_load import load_config
from byok.cursor import encode
from byok.cursor.checkpoint import Blob
from byok.cursor.client_messages import KvAnswer, kv_answer
from byok.http.app import App
from byok.http.connect_envelope import (
    ConnectError,
    FrameDecoder,
    encode_frame,
    end_stream_error,
)
from byok.loop.turn_values import Canceled, Succeeded
from byok.pb.agent import v1 as agent
from byok.run.conversation import ActiveRun
from byok.run.deps import RunDeps, ToolSetup
from byok.run.kv import KvFailure, KvLink
from byok.run.slot import RunSlot

# --- KV: SET/ACK and GET ------------------------------------------------------------------------


class KvClient:
    """Records the frames KvLink sends; answers nothing unless told to."""

    def __init__(self) -> None:
        self.frames: list[agent.KvServerMessage] = []

    def send(self, frame: bytes) -> None:
        kv = agent.AgentServerMessage.parse(frame).kv_server_message
        assert kv is not None
        self.frames.append(kv)


def ack(kv_id: int, error: str | None = None) -> KvAnswer:
    result = (
        agent.SetBlobResult(error=agent.Error(message=error)) if error is not None else agent.SetBlobResult()
    )
    return kv_answer(agent.KvClientMessage(id=kv_id, set_blob_result=result))


def get_answer(kv_id: int, data: bytes | None) -> KvAnswer:
    return kv_answer(agent.KvClientMessage(id=kv_id, get_blob_result=agent.GetBlobResult(blob_data=data)))


BLOBS = [Blob.of(b"first blob"), Blob.of(b"second blob")]
TIMEOUT = 30.0


async def test_put_without_ack_fails_after_exactly_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = KvClient()
    link = KvLink(client.send, set())
    t0 = trio.current_time()
    with pytest.raises(KvFailure, match=r"did not acknowledge 2 blob SET\(s\) within 30s"):
        await link.put(BLOBS, timeout_s=TIMEOUT)
    assert trio.current_time() - t0 == TIMEOUT
    assert [(f.id, f.set_blob_args.blob_id) for f in client.frames] == [(0, BLOBS[0].id), (1, BLOBS[1].id)]
    assert [f.set_blob_args.blob_data for f in client.frames] == [b.data for b in BLOBS]
    assert link.acked == set()
    # An ACK after the deadline is still the truth about the client's store: the put failed,
    # but a later checkpoint may reference that blob without sending it again.
    assert link.on_client(ack(0)) is True
    assert link.acked == {BLOBS[0].id}
    assert link.on_client(ack(0)) is False  # answered once


async def test_put_waits_for_sets_offered_earlier_without_sending_them_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = KvClient()
    link = KvLink(client.send, set())
    assert link.offer(BLOBS[:1]) == 1
    assert link.offer(BLOBS[:1]) == 0  # on its way already
    t0 = trio.current_time()

    async def ack_later() -> None:
        await trio.sleep(2)
        assert link.on_client(ack(0))
        await trio.sleep(1)
        assert link.on_client(ack(1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ack_later)
        assert await link.put(BLOBS, timeout_s=TIMEOUT) == 1  # only the second was new
    assert trio.current_time() - t0 == 3  # it waited for the earlier SET's ACK too
    assert [f.set_blob_args.blob_id for f in client.frames] == [b.id for b in BLOBS]
    assert link.acked == {b.id for b in BLOBS}
    assert await link.put(BLOBS, timeout_s=TIMEOUT) == 0


async def test_a_rejected_offer_is_set_again_by_the_put_that_needs_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = KvClient()
    link = KvLink(client.send, set())
    link.offer(BLOBS[:1])
    assert link.on_client(ack(0, error="disk full"))

    async def reject_again() -> None:
        await trio.sleep(1)
        assert link.on_client(ack(1, error="still full"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reject_again)
        with pytest.raises(KvFailure, match="still full"):
            await link.put(BLOBS[:1], timeout_s=TIMEOUT)
    assert [f.id for f in client.frames] == [0, 1]  # the client does not hold it: SET again
    assert link.acked == set()


async def test_put_partially_acked_names_the_missing(autojump_clock: trio.testing.MockClock) -> None:
    client = KvClient()
    link = KvLink(client.send, set())

    async def ack_first_only() -> None:
        await trio.sleep(1)
        assert link.on_client(ack(0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ack_first_only)
        with pytest.raises(KvFailure, match="did not acknowledge 1 blob"):
            await link.put(BLOBS, timeout_s=TIMEOUT)
    assert trio.current_time() == TIMEOUT
    assert link.acked == {BLOBS[0].id}


async def test_a_new_runsse_resends_what_is_unanswered_and_restarts_the_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The SETs and GETs written to a RunSSE that died are sent again on its successor, and the
    waits for their answers start over: the client reconnects within the grace (which may be as
    long as the ACK timeout) and then gets the whole timeout to answer."""
    client = KvClient()
    link = KvLink(client.send, set())
    got: list[bytes] = []

    async def read() -> None:
        got.append(await link.get(BLOBS[1].id, timeout_s=TIMEOUT))

    async def reconnect_then_answer() -> None:
        await trio.sleep(TIMEOUT - 1)  # the stream died unnoticed; a new RunSSE comes just in time
        assert link.resend_unacked() == 2
        set_frame, get_frame = client.frames[-2:]
        assert set_frame.set_blob_args.blob_id == BLOBS[0].id
        assert get_frame.get_blob_args.blob_id == BLOBS[1].id
        await trio.sleep(TIMEOUT - 1)  # past the first deadline, inside the restarted one
        assert link.on_client(ack(set_frame.id))
        assert link.on_client(get_answer(get_frame.id, b"second blob"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        nursery.start_soon(reconnect_then_answer)
        assert await link.put(BLOBS[:1], timeout_s=TIMEOUT) == 1
    assert trio.current_time() == 2 * TIMEOUT - 2
    assert got == [b"second blob"] and link.acked == {b.id for b in BLOBS}
    assert link.resend_unacked() == 0  # nothing left unanswered


async def test_put_returns_when_acks_arrive_in_time(autojump_clock: trio.testing.MockClock) -> None:
    client = KvClient()
    link = KvLink(client.send, set())

    async def answer_late() -> None:
        await trio.sleep(TIMEOUT - 0.5)  # just inside the deadline, in reverse order
        for frame in reversed(client.frames):
            assert link.on_client(ack(frame.id))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_late)
        t0 = trio.current_time()
        assert await link.put(BLOBS, timeout_s=TIMEOUT) == 2
        assert trio.current_time() - t0 == TIMEOUT - 0.5
    assert link.acked == {b.id for b in BLOBS}
    # Blobs the client holds are not sent again, and nothing is awaited.
    t1 = trio.current_time()
    assert await link.put(BLOBS, timeout_s=TIMEOUT) == 0
    assert trio.current_time() == t1 and len(client.frames) == 2


async def test_put_rejected_by_the_client(autojump_clock: trio.testing.MockClock) -> None:
    client = KvClient()
    link = KvLink(client.send, set())

    async def answer() -> None:
        await trio.sleep(0.1)
        assert link.on_client(ack(0))
        assert link.on_client(ack(1, error="disk full"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        with pytest.raises(KvFailure, match="rejected a blob SET: disk full"):
            await link.put(BLOBS, timeout_s=TIMEOUT)
    assert trio.current_time() == pytest.approx(0.1)  # no waiting for the deadline
    assert link.acked == {BLOBS[0].id}


async def test_put_answered_with_a_get_result_fails(autojump_clock: trio.testing.MockClock) -> None:
    client = KvClient()
    link = KvLink(client.send, set())

    async def answer() -> None:
        await trio.sleep(0)
        assert link.on_client(get_answer(0, b"x"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        with pytest.raises(KvFailure, match="not a set_blob_result"):
            await link.put(BLOBS[:1], timeout_s=TIMEOUT)
    assert link.acked == set()


async def test_put_sends_each_blob_once(autojump_clock: trio.testing.MockClock) -> None:
    client = KvClient()
    link = KvLink(client.send, set())

    async def answer() -> None:
        await trio.sleep(0.1)
        for frame in list(client.frames):
            link.on_client(ack(frame.id))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        await link.put([BLOBS[0], BLOBS[0]], timeout_s=TIMEOUT)
    assert len(client.frames) == 1


async def get_with(answer: bytes | None, *, never: bool = False, **kw: Any) -> bytes | KvFailure:
    """KvLink.get for BLOBS[0], the client answering ``answer`` after 2 s (``never``: no answer);
    returns the data or the KvFailure raised."""
    client = KvClient()
    link = KvLink(client.send, set())

    async def reply() -> None:
        await trio.sleep(2)
        (frame,) = client.frames
        assert frame.get_blob_args.blob_id == BLOBS[0].id
        assert link.on_client(get_answer(frame.id, answer))

    async with trio.open_nursery() as nursery:
        if not never:
            nursery.start_soon(reply)
        try:
            data = await link.get(BLOBS[0].id, TIMEOUT, **kw)
        except KvFailure as e:
            assert BLOBS[0].id not in link.acked
            return e
    assert BLOBS[0].id in link.acked
    return data


async def test_get_verified(autojump_clock: trio.testing.MockClock) -> None:
    assert await get_with(BLOBS[0].data, expected_len=len(BLOBS[0].data)) == BLOBS[0].data
    assert trio.current_time() == 2


async def test_get_timeout(autojump_clock: trio.testing.MockClock) -> None:
    err = await get_with(None, never=True)
    assert isinstance(err, KvFailure) and "did not answer the GET" in str(err) and "within 30s" in str(err)
    assert trio.current_time() == TIMEOUT


@pytest.mark.parametrize(
    ("answer", "kw", "error"),
    [
        (b"not the blob", {}, "failed its SHA-256 check"),
        (BLOBS[0].data, {"expected_len": 3}, "expected 3"),
        (b"", {}, "client has no blob"),
        (None, {}, "client has no blob"),
    ],
    ids=["bad-hash", "wrong-length", "empty", "missing"],
)
async def test_get_rejects(
    autojump_clock: trio.testing.MockClock, answer: bytes | None, kw: dict[str, int], error: str
) -> None:
    err = await get_with(answer, **kw)
    assert isinstance(err, KvFailure) and error in str(err)
    assert trio.current_time() == 2  # failed on the answer, not at the deadline


# --- the App: heartbeat, reconnect grace, shutdown -----------------------------------------------


def make_app(nursery: trio.Nursery, **server: float) -> App:
    config = load_config(None, overrides={})
    config = attrs.evolve(config, server=attrs.evolve(config.server, **server))
    # None for store/http/call_log: these tests never start a Run, so they are never touched.
    deps = RunDeps(
        config=config,
        store=None,  # type: ignore[arg-type]
        prompts={},
        tools=ToolSetup(registry={}, specs_by_mode={}),
        http=None,  # type: ignore[arg-type]
        call_log=None,  # type: ignore[arg-type]
    )
    return App(config=config, deps=deps, nursery=nursery, forward=None)


@attrs.define
class FakeResponse:
    """ASGI receive/send for one RunSSE response. ``disconnect`` makes receive report the client
    gone; sent bodies are recorded with the (virtual) time they went out."""

    disconnected: trio.Event = attrs.Factory(trio.Event)
    sent: list[tuple[float, bytes, bool]] = attrs.Factory(list)

    async def receive(self) -> dict[str, Any]:
        await self.disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, event: dict[str, Any]) -> None:
        assert event["type"] == "http.response.body"
        self.sent.append((trio.current_time(), event["body"], event["more_body"]))

    def messages(self) -> list[tuple[float, str]]:
        """(time, kind) of each frame: heartbeat, checkpoint, end-stream, ..."""
        out = []
        for at, body, _ in self.sent:
            for frame in FrameDecoder().feed(body):
                if frame.end_stream:
                    out.append((at, "end-stream:" + frame.payload.decode()))
                    continue
                msg = agent.AgentServerMessage.parse(frame.payload)
                if msg.interaction_update is not None and msg.interaction_update.heartbeat is not None:
                    out.append((at, "heartbeat"))
                else:
                    out.append((at, "text:" + msg.interaction_update.text_delta.text))
        return out


def text(t: str) -> bytes:
    return bytes(
        agent.AgentServerMessage(
            interaction_update=agent.InteractionUpdate(text_delta=agent.TextDeltaUpdate(text=t))
        )
    )


async def test_idle_stream_heartbeats_and_forwards_in_order(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    hb = app.config.server.heartbeat_s
    slot = RunSlot("r1")
    resp = FakeResponse()

    async def run_side() -> None:
        await trio.sleep(3 * hb + 1)  # idle: three heartbeats
        slot.send(text("a"))
        slot.send(text("b"))
        await trio.sleep(hb / 2)
        slot.send(text("c"))
        await trio.sleep(2 * hb)  # idle again: two heartbeats (timed from the last frame)
        slot.close(Succeeded())

    nursery.start_soon(run_side)
    await app.run_streams._stream_frames(slot, resp.receive, resp.send)
    t_a = 3 * hb + 1
    assert resp.messages() == [
        (hb, "heartbeat"),
        (2 * hb, "heartbeat"),
        (3 * hb, "heartbeat"),
        (t_a, "text:a"),
        (t_a, "text:b"),
        (t_a + hb / 2, "text:c"),
        (t_a + hb / 2 + hb, "heartbeat"),
        (t_a + hb / 2 + 2 * hb, "heartbeat"),
        (t_a + hb / 2 + 2 * hb, "end-stream:{}"),
    ]
    # The end-stream frame ends the response: one last empty body with more_body False.
    assert resp.sent[-1][1:] == (b"", False)
    assert all(more for _, _, more in resp.sent[:-1])
    assert not slot.attached


async def test_buffered_frames_then_end_stream(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """A run that finished before RunSSE attached: every frame, then the end, at once."""
    app = make_app(nursery)
    slot = RunSlot("r1")
    slot.send(text("x"))
    slot.close(Canceled())
    err = end_stream_error(ConnectError("canceled", "run was cancelled"))
    slot.send(text("after close"))  # ignored
    resp = FakeResponse()
    await app.run_streams._stream_frames(slot, resp.receive, resp.send)
    assert [k for _, k in resp.messages()] == ["text:x", "end-stream:" + err[5:].decode()]
    assert trio.current_time() == 0


async def test_drop_without_reconnect_cancels_after_exactly_the_grace(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    grace = app.config.server.reconnect_grace_s
    slot = RunSlot("r1")
    cancelled_at: list[float] = []
    slot.cancel_run = lambda: cancelled_at.append(trio.current_time())
    resp = FakeResponse()

    async def drop() -> None:
        await trio.sleep(7)
        resp.disconnected.set()

    nursery.start_soon(drop)
    await app.run_streams._stream_frames(slot, resp.receive, resp.send)
    assert trio.current_time() == 7 and not slot.attached
    await trio.sleep(grace + 100)
    assert cancelled_at == [7 + grace]


async def test_reconnect_within_grace_keeps_the_run(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    grace = app.config.server.reconnect_grace_s
    slot = RunSlot("r1")
    cancelled: list[float] = []
    slot.cancel_run = lambda: cancelled.append(trio.current_time())
    slot.send(text("old"))
    first, second = FakeResponse(), FakeResponse()

    async def first_stream() -> None:
        await app.run_streams._stream_frames(slot, first.receive, first.send)

    nursery.start_soon(first_stream)
    await trio.sleep(1)
    first.disconnected.set()
    await trio.sleep(1)
    slot.send(text("while away"))  # buffered for the next stream
    await trio.sleep(grace - 5)  # reconnect 3 s before the grace runs out

    async def second_stream() -> None:
        await app.run_streams._stream_frames(slot, second.receive, second.send)

    nursery.start_soon(second_stream)
    await trio.sleep(10 * grace)
    assert cancelled == []
    assert slot.attached
    assert [k for _, k in first.messages()] == ["text:old"]
    # The new stream continues from where it starts: no replay of what the old one delivered.
    kinds = [k for _, k in second.messages()]
    assert kinds[0] == "text:while away" and set(kinds[1:]) == {"heartbeat"}
    slot.close(Succeeded())
    await trio.sleep(0.1)
    assert [k for _, k in second.messages()][-1] == "end-stream:{}"


async def test_grace_ends_quietly_when_the_run_finished(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    slot = RunSlot("r1")
    cancelled: list[float] = []
    slot.cancel_run = lambda: cancelled.append(trio.current_time())
    nursery.start_soon(app.service._grace, slot)
    await trio.sleep(1)
    slot.close(Succeeded())  # the run ended during the grace
    await trio.sleep(app.config.server.reconnect_grace_s)
    assert cancelled == []


async def test_slot_attach_detach() -> None:
    slot = RunSlot("r1")
    a, b = trio.CancelScope(), trio.CancelScope()
    first_event = slot.attached_event
    slot.attach(a)
    assert slot.attached and first_event.is_set()
    slot.attach(b)  # a newer RunSSE takes over: the old one is cancelled
    assert a.cancel_called and not b.cancel_called
    assert slot.detach(a) is False and slot.attached  # the old stream leaving changes nothing
    assert slot.detach(b) is True and not slot.attached
    assert not slot.attached_event.is_set()  # a fresh event for the next reattach


def fake_run(app: App, request_id: str, duration: float, log: list[tuple[str, str, float]]) -> None:
    """Register a run in ``app.service.active`` the way App._run_task does; it lasts ``duration``."""
    me = ActiveRun(request_id, trio.CancelScope(), trio.Event())
    app.service.active.add(me)
    if app.service._idle.is_set():
        app.service._idle = trio.Event()

    async def body() -> None:
        try:
            with me.scope:
                await trio.sleep(duration)
                log.append((request_id, "finished", trio.current_time()))
            if me.scope.cancelled_caught:
                log.append((request_id, "cancelled", trio.current_time()))
        finally:
            me.done.set()
            app.service.active.discard(me)
            if not app.service.active:
                app.service._idle.set()

    app.service.nursery.start_soon(body)


async def test_shutdown_returns_when_runs_end_before_the_deadline(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    log: list[tuple[str, str, float]] = []
    fake_run(app, "a", 3, log)
    fake_run(app, "b", 5, log)
    await app.shutdown(10)
    assert trio.current_time() == 5
    assert sorted(log) == [("a", "finished", 3), ("b", "finished", 5)]
    assert not app.service.accepting and not app.service.active


async def test_shutdown_cancels_at_the_deadline(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    log: list[tuple[str, str, float]] = []
    fake_run(app, "quick", 2, log)
    fake_run(app, "slow", 1000, log)
    fake_run(app, "slower", 5000, log)
    await app.shutdown(10)
    assert trio.current_time() == 10
    assert sorted(log) == [("quick", "finished", 2), ("slow", "cancelled", 10), ("slower", "cancelled", 10)]
    assert not app.service.active


async def test_shutdown_when_idle_is_immediate(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    await app.shutdown(10)
    assert trio.current_time() == 0 and not app.service.accepting


async def test_no_new_run_after_shutdown(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    app = make_app(nursery)
    await app.shutdown(10)
    slot = RunSlot("late")
    err = app._start_run(slot, agent.AgentRunRequest())
    assert err is not None and err.code == "unavailable"
    assert slot.closed and not slot.run_started


def test_heartbeat_frame_is_an_interaction_heartbeat() -> None:
    frame = encode_frame(encode.heartbeat())
    (decoded,) = FrameDecoder().feed(frame)
    msg = agent.AgentServerMessage.parse(decoded.payload)
    assert msg.interaction_update is not None and msg.interaction_update.heartbeat is not None
