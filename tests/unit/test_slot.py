"""RunSlot: the frames a run queues, and how it waits for its stream writer to send them."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from byok.loop.turn_values import Succeeded
from byok.run.slot import FLUSH_WAIT_S, RunSlot


class Writer:
    """A stream writer as run_stream's: takes what is queued, sends it under ``slot.writing``;
    each send finishes when the test says so (a socket the client reads at its own pace)."""

    def __init__(self, slot: RunSlot) -> None:
        self.slot = slot
        self.sent: list[bytes] = []
        self.go = trio.Event()

    async def run(self) -> None:
        with trio.CancelScope() as scope:
            self.slot.attach(scope)
            try:
                while True:
                    batch = [await self.slot.frames.receive()]
                    while True:
                        try:
                            batch.append(self.slot.frames.receive_nowait())
                        except trio.WouldBlock:
                            break
                    with self.slot.writing(len(batch)):
                        await self.go.wait()
                        self.go = trio.Event()
                        self.sent += batch
            finally:
                self.slot.detach(scope)


async def test_flushed_returns_once_the_writer_has_sent_what_was_queued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slot = RunSlot("r")
    start = trio.current_time()
    writer = Writer(slot)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.testing.wait_all_tasks_blocked()
        slot.send(b"a")
        slot.send(b"b")
        done = trio.Event()

        async def flush() -> None:
            await slot.flushed()
            done.set()

        nursery.start_soon(flush)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()  # taken, still being sent
        writer.go.set()
        await done.wait()
        assert writer.sent == [b"a", b"b"]  # the messages; http/ frames them
        assert trio.current_time() == start  # woken by the send, not by the bound
        nursery.cancel_scope.cancel()


async def test_flushed_does_not_wait_without_a_stream(autojump_clock: trio.testing.MockClock) -> None:
    slot = RunSlot("r")
    slot.send(b"a")
    start = trio.current_time()
    await slot.flushed()  # no stream attached: the frame waits in the channel for one
    assert trio.current_time() == start


async def test_flushed_gives_up_on_a_writer_that_cannot_send(autojump_clock: trio.testing.MockClock) -> None:
    slot = RunSlot("r")
    writer = Writer(slot)  # its send never finishes: a client that does not read
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.testing.wait_all_tasks_blocked()
        slot.send(b"a")
        start = trio.current_time()
        await slot.flushed()
        assert trio.current_time() - start == pytest.approx(FLUSH_WAIT_S)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("stuck", ["sending frames", "sending a heartbeat"])
async def test_flushed_returns_when_the_stream_goes_away(
    autojump_clock: trio.testing.MockClock, stuck: str
) -> None:
    slot = RunSlot("r")
    writer = Writer(slot)
    start = trio.current_time()
    done = trio.Event()

    async def flush() -> None:
        await slot.flushed()
        done.set()

    async def heartbeat() -> None:  # attached, but not taking frames: its send does not end
        with trio.CancelScope() as scope:
            slot.attach(scope)
            try:
                await trio.sleep_forever()
            finally:
                slot.detach(scope)

    async with trio.open_nursery() as nursery:
        dropped = trio.CancelScope()

        async def stream() -> None:
            with dropped:
                await (writer.run() if stuck == "sending frames" else heartbeat())

        nursery.start_soon(stream)
        await trio.testing.wait_all_tasks_blocked()
        slot.send(b"a")
        nursery.start_soon(flush)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
        dropped.cancel()  # the RunSSE drops: the writer detaches
        await done.wait()
    assert not slot.attached
    assert trio.current_time() == start  # woken by the detach, not by the bound


async def test_frames_queued_before_a_stream_attaches_are_kept_in_order() -> None:
    slot = RunSlot("r")
    for frame in (b"a", b"b", b"c"):
        slot.send(frame)
    slot.close(Succeeded())
    slot.send(b"late")  # after the end: dropped
    got = [frame async for frame in slot.frames]
    assert got == [b"a", b"b", b"c", Succeeded()]  # the outcome last; http/ frames them
