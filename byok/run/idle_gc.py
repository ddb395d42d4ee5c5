"""Full garbage collections between runs, not in the middle of one.

CPython's cyclic GC runs a full (generation-2) collection whenever enough objects have survived
the younger generations, and a full collection scans every tracked object: with a few
conversations' histories in memory that was a 21-52 ms pause in the middle of runs (traced in
bench 1; they were the growing conversation's TTFT p99). ``byok serve`` turns the automatic full
collections off (``FULL_COLLECTIONS_OFF``) and this task collects instead: once no run is active
and none has ended for ``idle_s``, and after ``max_gap_s`` of unbroken activity in any case, so
cyclic garbage stays bounded. It only collects when a run has started since its last collection.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable

import trio

from byok.allocator import release_free_memory

log = logging.getLogger("byok.gc")

# gc.set_threshold values: CPython's defaults for generations 0 and 1, generation 2 never on its own.
FULL_COLLECTIONS_OFF = (700, 10, 2**31 - 1)
IDLE_S = 1.0
MAX_GAP_S = 300.0


class RunActivity:
    """How many runs are active, how many ever started, and when the last one ended."""

    def __init__(self) -> None:
        self.active = 0
        self.started_total = 0
        self.last_end = -math.inf
        self._changed = trio.Event()

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


def full_collection() -> None:
    """A full collection, then the freed heap back to the OS (the allocator settings keep it
    resident between turns, where re-faulting it would cost; an idle daemon need not hold it)."""
    started = time.perf_counter()
    found = gc.collect()
    release_free_memory()
    took_ms = 1e3 * (time.perf_counter() - started)
    log.debug("full collection between runs: %d unreachable, %.1f ms", found, took_ms)


async def collect_when_idle(
    activity: RunActivity,
    *,
    idle_s: float = IDLE_S,
    max_gap_s: float = MAX_GAP_S,
    collect: Callable[[], None] = full_collection,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    seen = activity.started_total
    collected_at = trio.current_time()
    while True:
        now = trio.current_time()
        wake = math.inf
        if activity.started_total != seen:
            quiet_at = activity.last_end + idle_s
            if (activity.active == 0 and now >= quiet_at) or now >= collected_at + max_gap_s:
                seen, collected_at = activity.started_total, now
                collect()
                continue
            wake = collected_at + max_gap_s
            if activity.active == 0:
                wake = min(wake, quiet_at)
        with trio.move_on_at(wake):
            await activity.changed()
