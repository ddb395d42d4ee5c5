"""Full collections run between runs: after a quiet second with no run active, or after five
minutes of unbroken activity, and never twice for the same work."""

from __future__ import annotations

import trio
import trio.testing

from byok.run.idle_gc import RunActivity, collect_when_idle


async def _collector(nursery: trio.Nursery, activity: RunActivity) -> list[float]:
    times: list[float] = []
    await nursery.start(
        lambda task_status: collect_when_idle(
            activity,
            idle_s=1.0,
            max_gap_s=300.0,
            collect=lambda: times.append(trio.current_time()),
            task_status=task_status,
        )
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
        for _ in range(100):
            activity.started()
            await trio.sleep(5)
            activity.finished()
        assert [round(t - t0) for t in times] == [300]
        nursery.cancel_scope.cancel()
