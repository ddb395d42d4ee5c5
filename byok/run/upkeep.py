"""Upkeep between runs: work that would cost a run its time if it happened during one.

- A full garbage collection. CPython runs one whenever enough objects have survived the younger
  generations, and it scans every tracked object: with a few conversations' histories in memory
  that was a 21-52 ms pause in the middle of runs (traced in bench 1; they were the growing
  conversation's TTFT p99). ``byok serve`` turns the automatic ones off (``FULL_COLLECTIONS_OFF``).
- The freed heap back to the OS, which the allocator settings keep resident during activity.
- The SQLite WAL copied into the database file. Run after each run, the checkpoint held the
  store's one worker (0.6 ms median, up to 6 ms of fsyncs) just as the next run's first store
  call arrived. Under continuous load a large WAL is copied while every active run waits on its
  provider (``checkpoint_while_calling``); SQLite's autocheckpoint is the last bound.

One task does them once no run has been active for ``idle_s``, and after ``max_gap_s`` of
unbroken activity in any case, so garbage and the WAL stay bounded; only when a run has started
since the last time.

What the daemon keeps for fast next turns is bounded by one byte budget, not by a timer
(run/conversation_caches.py); the heap an evicted conversation freed goes back to the OS here.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator

import trio

from byok.allocator import release_free_memory
from byok.store import AsyncStore, SQLiteStore, StoreError

log = logging.getLogger("byok.upkeep")

# gc.set_threshold values: CPython's defaults for generations 0 and 1, generation 2 never on its own.
FULL_COLLECTIONS_OFF = (700, 10, 2**31 - 1)
IDLE_S = 1.0
MAX_GAP_S = 300.0


class RunActivity:
    """How many runs are active, how many ever started, when the last one ended, and how many
    are waiting on their provider (the store has nothing to do for those)."""

    def __init__(self) -> None:
        self.active = 0
        self.started_total = 0
        self.last_end = -math.inf
        self.calling = 0
        self._changed = trio.Event()

    @contextlib.contextmanager
    def provider_call(self) -> Iterator[None]:
        """Around a run's provider call."""
        self.calling += 1
        self._poke()
        try:
            yield
        finally:
            self.calling -= 1
            self._poke()

    def started(self) -> None:
        self.active += 1
        self.started_total += 1
        self._poke()

    def finished(self) -> None:
        self.active -= 1
        self.last_end = trio.current_time()
        self._poke()

    async def changed(self) -> None:
        await self._changed.wait()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


async def until_quiet(activity: RunActivity, max_wait_s: float) -> None:
    """Until no run is active, or for ``max_wait_s`` at most (under unbroken activity)."""
    with trio.move_on_after(max_wait_s):
        while activity.active:
            await activity.changed()


async def tidy(store: AsyncStore) -> None:
    """The daemon's upkeep: the WAL into the database file (on the store's worker), then a full
    collection and the freed heap back to the OS."""
    try:
        await store.call(SQLiteStore.checkpoint_wal)
    except StoreError as e:
        log.warning("WAL checkpoint failed: %s", e)
    started = time.perf_counter()
    found = gc.collect()
    release_free_memory()
    took_ms = 1e3 * (time.perf_counter() - started)
    log.debug("full collection between runs: %d unreachable, %.1f ms", found, took_ms)


# While every active run waits on its provider, a WAL this large is copied into the database:
# otherwise a long run of big tool results reaches SQLite's autocheckpoint, which copies up to
# 64 MiB inside whichever commit crosses it (101 and 147 ms in bench 4). Half of that: each
# checkpoint is an fsync of the database that a fast provider's next commit may wait behind
# (at 8 MiB, bench 1's 300 small turns checkpointed 17 times; at 32 MiB, 4 times).
WAL_CHECKPOINT_WHILE_CALLING_BYTES = 32 * 2**20


async def checkpoint_while_calling(
    activity: RunActivity,
    store: AsyncStore,
    *,
    min_bytes: int = WAL_CHECKPOINT_WHILE_CALLING_BYTES,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Checkpoint the WAL on the store's worker when it is idle during activity: every active
    run is waiting on its provider (a model streams for seconds; the next store call is its
    answer's commit). Until cancelled."""
    task_status.started()
    while True:
        await activity.changed()
        if activity.active and activity.calling >= activity.active and store.wal_bytes() >= min_bytes:
            try:
                await store.call(SQLiteStore.checkpoint_wal)
            except StoreError as e:
                log.warning("WAL checkpoint failed: %s", e)


async def between_runs(
    activity: RunActivity,
    work: Callable[[], Awaitable[None]],
    *,
    idle_s: float = IDLE_S,
    max_gap_s: float = MAX_GAP_S,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``work`` between runs (see the module docstring), until cancelled."""
    task_status.started()
    seen = activity.started_total
    done_at = trio.current_time()
    while True:
        now = trio.current_time()
        wake = math.inf
        if activity.started_total != seen:
            quiet_at = activity.last_end + idle_s
            if (activity.active == 0 and now >= quiet_at) or now >= done_at + max_gap_s:
                seen, done_at = activity.started_total, now
                await work()
                continue
            wake = done_at + max_gap_s
            if activity.active == 0:
                wake = min(wake, quiet_at)
        with trio.move_on_at(wake):
            await activity.changed()
