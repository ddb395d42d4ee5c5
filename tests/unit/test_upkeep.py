"""Upkeep runs between runs: after a quiet second with no run active, or after five minutes of
unbroken activity, and never twice for the same work. With the daemon's own upkeep, the WAL
stays out of the database file while runs come and goes in afterwards."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio
import trio.testing

from byok.model.messages import Message
from byok.run.upkeep import (
    RunActivity,
    between_runs,
    checkpoint_while_calling,
    tidy,
    until_quiet,
)
from byok.store import AsyncStore
from byok.store.schema import WAL_SIZE_LIMIT_BYTES


async def _collector(nursery: trio.Nursery, activity: RunActivity) -> list[float]:
    times: list[float] = []

    async def work() -> None:
        times.append(trio.current_time())

    await nursery.start(
        lambda task_status: between_runs(activity, work, idle_s=1.0, max_gap_s=300.0, task_status=task_status)
    )
    return times


async def test_collects_once_a_second_after_the_last_run_ends(autojump_clock: trio.testing.MockClock) -> None:
    activity = RunActivity()
    async with trio.open_nursery() as nursery:
        times = await _collector(nursery, activity)
        await trio.sleep(50)
        assert times == []  # nothing has run: nothing to collect
        activity.started()
        await trio.sleep(5)  # a 5 s run: no collection while it is active
        activity.started()  # a second one overlaps it
        activity.finished()
        await trio.sleep(0.5)
        activity.finished()
        end = trio.current_time()
        await trio.sleep(0.9)
        assert times == []  # quiet, but not for a second yet
        await trio.sleep(0.2)
        assert times == [end + 1.0]
        await trio.sleep(1000)
        assert times == [end + 1.0]  # no new run: no second collection
        nursery.cancel_scope.cancel()


async def test_back_to_back_runs_are_not_interrupted(autojump_clock: trio.testing.MockClock) -> None:
    activity = RunActivity()
    async with trio.open_nursery() as nursery:
        times = await _collector(nursery, activity)
        for _ in range(20):  # runs 0.5 s apart: never a quiet second between them
            activity.started()
            await trio.sleep(2)
            activity.finished()
            await trio.sleep(0.5)
        assert times == []
        await trio.sleep(1)
        assert len(times) == 1
        nursery.cancel_scope.cancel()


async def test_unbroken_activity_is_collected_every_max_gap(autojump_clock: trio.testing.MockClock) -> None:
    activity = RunActivity()
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        times = await _collector(nursery, activity)
        activity.started()  # one run that never ends, with others coming and going beside it
        for _ in range(130):  # 650 s: two whole gaps, so "every" is the second one too
            activity.started()
            await trio.sleep(5)
            activity.finished()
        # Never a quiet second (one run is always active): only the gap, counted from the start
        # and then from each collection, brings one on.
        assert [t - t0 for t in times] == pytest.approx([300.0, 600.0])
        nursery.cancel_scope.cancel()


async def test_the_wal_is_checkpointed_only_between_runs(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    activity = RunActivity()
    done: list[float] = []
    finished = trio.Event()

    async with await AsyncStore.open(tmp_path / "data") as store, trio.open_nursery() as nursery:

        async def work() -> None:
            started = trio.current_time()
            await tidy(store)  # real threads and a real collection: waited for, not timed
            done.append(started)
            finished.set()

        await nursery.start(
            # No max gap: while a store call waits on its real thread, the mock clock jumps to
            # the nearest deadline, and a gap deadline would be reached in no real time.
            lambda task_status: between_runs(
                activity, work, idle_s=1.0, max_gap_s=math.inf, task_status=task_status
            )
        )
        db = store.path
        before = db.stat().st_size
        version = 0
        # A run every 0.5 s for 5 s, each appending: never a quiet second, so no checkpoint.
        for i in range(10):
            activity.started()
            message = Message(role="user", origin="runtime", text=f"{i}" * 400_000)
            version = (await store.append("c", version, [message], 1)).version
            activity.finished()
            await trio.sleep(0.5)
            assert done == []
        assert db.stat().st_size - before < 400_000  # all of it still in the WAL
        last = activity.last_end
        await finished.wait()
        assert done[0] >= last + 1.0
        assert db.stat().st_size - before > 4_000_000
        # Nothing new: no second checkpoint, however long the daemon stays idle.
        await trio.sleep(10)
        assert len(done) == 1
        nursery.cancel_scope.cancel()


async def test_the_wal_is_checkpointed_while_every_active_run_waits_on_its_provider(tmp_path: Path) -> None:
    """During activity the store's worker is free while the runs' models stream: a WAL of
    min_bytes or more is copied into the database then, not in a later commit (SQLite's
    autocheckpoint). Not while a run may need the store."""
    activity = RunActivity()
    async with await AsyncStore.open(tmp_path / "data") as store, trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: checkpoint_while_calling(
                activity, store, min_bytes=2_000_000, task_status=task_status
            )
        )
        db = store.path
        before = db.stat().st_size

        async def settled() -> None:
            # The watcher has taken the store's worker (if it is going to): wait behind it.
            await trio.testing.wait_all_tasks_blocked()
            await store.call(lambda s: None)

        activity.started()
        activity.started()  # two runs
        version = 0
        for i in range(8):
            message = Message(role="user", origin="runtime", text=f"{i}" * 400_000)
            version = (await store.append("c", version, [message], 1)).version
        assert store.wal_bytes() > 3_000_000
        with activity.provider_call():  # one run calls its provider, the other may use the store
            await settled()
            assert db.stat().st_size - before < 400_000
            with activity.provider_call():  # now both do
                await settled()
                assert db.stat().st_size - before > 3_000_000
        # SQLite starts the WAL over at the next write and cuts the file back to the limit.
        await store.append("c", version, [Message(role="user", origin="runtime", text="x")], 1)
        assert store.wal_bytes() <= WAL_SIZE_LIMIT_BYTES
        # Under the threshold: calls alone do not checkpoint.
        checkpointed = db.stat().st_size
        with activity.provider_call(), activity.provider_call():
            await settled()
        assert db.stat().st_size == checkpointed
        nursery.cancel_scope.cancel()


async def test_until_quiet_waits_for_the_last_active_run_or_gives_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    activity = RunActivity()
    t0 = trio.current_time()
    await until_quiet(activity, 1.0)
    assert trio.current_time() == t0  # nothing active: at once

    async def runs(nursery_done: trio.Event) -> None:
        activity.started()
        activity.started()
        await trio.sleep(0.2)
        activity.finished()
        await trio.sleep(0.3)
        activity.finished()
        nursery_done.set()

    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runs, done)
        await trio.sleep(0.01)
        await until_quiet(activity, 1.0)
        assert trio.current_time() == pytest.approx(t0 + 0.5)  # both runs over
        assert done.is_set()

    activity.started()  # a run that does not end: the wait is bounded
    t1 = trio.current_time()
    await until_quiet(activity, 1.0)
    assert trio.current_time() == pytest.approx(t1 + 1.0)
