"""RunSSE's wait for the run_request that decides local or relayed: how long, what a client
that leaves gets, and the cap on streams waiting (in-memory ASGI, MockClock)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from byok.config import Config, ServerConfig
from byok.http.asgi import ClientGone
from byok.http.connect_envelope import encode_frame
from byok.http.run_stream import DECISION_TIMEOUT_S, MAX_UNDECIDED_STREAMS, RunStreams
from byok.pb.aiserver import v1 as aiserver
from byok.run.slot import RunRegistry, RunSlot


class Client:
    """One RunSSE's ASGI side: the body, then nothing until ``leave``."""

    def __init__(self, request_id: str) -> None:
        self.body = encode_frame(bytes(aiserver.BidiRequestId(request_id=request_id)))
        self.sent: list[dict[str, Any]] = []
        self._left = trio.Event()
        self._read = False

    async def receive(self) -> dict[str, Any]:
        if not self._read:
            self._read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)

    def leave(self) -> None:
        self._left.set()

    @property
    def tail(self) -> bytes:
        return self.sent[-1].get("body", b"") if self.sent else b""


SCOPE = {"type": "http", "headers": [(b"content-type", b"application/connect+proto")]}


class Lifecycle:
    """The run service's side that RunSSE reports to (no run is started here)."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def stream_dropped(self, slot: RunSlot) -> None:
        self.dropped.append(slot.request_id)


def streams(nursery: trio.Nursery) -> RunStreams:
    config = Config(server=ServerConfig(), providers=(), models=(), source="<test>")
    return RunStreams(
        config=config,
        registry=RunRegistry(),
        forward=None,
        service=Lifecycle(),  # type: ignore[arg-type]
        append=lambda *a: None,
    )


async def test_no_run_request_ends_the_stream_at_the_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        rs = streams(nursery)
        client = Client("r1")
        start = trio.current_time()
        await rs.run_sse(SCOPE, client.receive, client.send)
        assert trio.current_time() - start == pytest.approx(DECISION_TIMEOUT_S)
        assert b"deadline_exceeded" in client.tail
        # Nothing is kept of it: no slot, no count.
        assert rs.registry.get("r1") is None and not rs.undecided


async def test_a_client_that_leaves_is_let_go_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        rs = streams(nursery)
        client = Client("r1")
        start = trio.current_time()
        gone = trio.Event()

        async def stream() -> None:
            with pytest.raises(ClientGone):
                await rs.run_sse(SCOPE, client.receive, client.send)
            gone.set()

        nursery.start_soon(stream)
        await trio.testing.wait_all_tasks_blocked()
        assert rs.undecided["r1"] == 1
        client.leave()
        await gone.wait()
        assert trio.current_time() == start  # not a tick of the timeout
        assert rs.registry.get("r1") is None and not rs.undecided


async def test_a_decision_ends_the_wait(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        rs = streams(nursery)
        client = Client("r1")
        done = trio.Event()

        async def stream() -> None:
            slot = rs.registry.get_or_create("r1")
            assert await rs.await_decision(slot, client.receive) is None
            done.set()

        await client.receive()  # the body, as run_sse reads it first
        nursery.start_soon(stream)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        rs.registry.get_or_create("r1").decide("agent")
        await done.wait()
        assert trio.current_time() == start
        assert rs.registry.get("r1") is not None and not rs.undecided


async def test_streams_past_the_cap_are_refused_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        rs = streams(nursery)
        waiting = [Client(f"r{i}") for i in range(MAX_UNDECIDED_STREAMS)]
        for c in waiting:
            nursery.start_soon(rs.run_sse, SCOPE, c.receive, c.send)
        await trio.testing.wait_all_tasks_blocked()
        assert rs.undecided.total() == MAX_UNDECIDED_STREAMS
        start = trio.current_time()
        over = Client("over")
        await rs.run_sse(SCOPE, over.receive, over.send)
        assert trio.current_time() == start
        assert b"resource_exhausted" in over.tail
        assert rs.registry.get("over") is None
        nursery.cancel_scope.cancel()
