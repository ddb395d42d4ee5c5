"""RunSlot helpers that order work between a run and its stream writer."""

from __future__ import annotations

import trio
import trio.testing

from byok.run.slot import RunSlot, let_ready_tasks_run


async def test_a_task_woken_before_the_call_has_run_when_it_returns() -> None:
    """Trio runs each batch of ready tasks in either order; two checkpoints cover both orders.
    Repeated so both orders actually occur."""
    for _ in range(200):
        send, recv = trio.open_memory_channel[int](1)
        got: list[int] = []

        async def reader(recv: trio.MemoryReceiveChannel[int] = recv, got: list[int] = got) -> None:
            got.append(await recv.receive())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            send.send_nowait(1)  # wakes the reader, as slot.send wakes the stream writer
            await let_ready_tasks_run()
            assert got == [1]


async def test_frames_queued_before_a_stream_attaches_are_kept_in_order() -> None:
    slot = RunSlot("r")
    for frame in (b"a", b"b", b"c"):
        slot.send(frame)
    slot.close(b"end")
    slot.send(b"late")  # after the end frame: dropped
    got = [frame async for frame in slot.frames]
    assert got[-1] == b"end" and len(got) == 4
    assert [g[5:] for g in got[:3]] == [b"a", b"b", b"c"]  # each in its Connect envelope
