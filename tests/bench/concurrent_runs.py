"""Simultaneous streaming runs with per-delta timings and the daemon's RSS (benchmarks 3 and 10)."""

from __future__ import annotations

import itertools
import re
import time

import attrs
import trio

from tests.bench.common import turn_request
from tests.bench.driver import Bench, LightTranscript, harness_gc_off, light_run
from tests.support.fake_provider import chat_text_script

DELTA_GAP_S = 0.02


@attrs.frozen
class ConcurrencyStats:
    latency: list[float]  # per delta: client arrival - provider send
    added_gap: list[float]  # per consecutive pair: client gap - provider gap
    slip: list[float]  # per consecutive pair: provider gap - nominal gap
    wall: float
    harness_cpu: float
    daemon_cpu: float | None
    rss_samples: list[int]


async def concurrent_runs(b: Bench, runs: int, deltas: int, gap_s: float, tag: str) -> ConcurrencyStats:
    """``runs`` simultaneous runs (distinct conversations), each streaming ``deltas`` deltas
    with ``gap_s`` between provider chunks; the daemon's RSS sampled every 0.2 s meanwhile."""
    texts = [f"{j:03d} " for j in range(deltas)]
    for _ in range(runs):
        b.provider.enqueue(chat_text_script(texts, delay_s=gap_s))
    transcripts: dict[int, LightTranscript] = {}
    rss_samples: list[int] = []

    async def one(i: int) -> None:
        rid = f"{tag}-{i:03d}"
        request = turn_request(f"concurrent run {tag} {i:03d}", f"{tag}-conv-{i}", f"m-{rid}")
        transcripts[i] = await light_run(b.sim, rid, request)

    async def sample_rss() -> None:
        while b.pid is not None:
            rss_samples.append(b.daemon_rss())
            await trio.sleep(0.2)

    with harness_gc_off():
        cpu0, wall0 = time.process_time(), time.monotonic()
        daemon0 = b.daemon_cpu_s() if b.pid is not None else 0.0
        async with trio.open_nursery() as outer:
            outer.start_soon(sample_rss)
            async with trio.open_nursery() as group:
                for i in range(runs):
                    group.start_soon(one, i)
            outer.cancel_scope.cancel()
        cpu1, wall1 = time.process_time(), time.monotonic()
        daemon1 = b.daemon_cpu_s() if b.pid is not None else 0.0
    by_run: dict[int, int] = {}
    for idx, req in enumerate(b.provider.requests):
        found = re.search(rf"concurrent run {tag} (\d{{3}})".encode(), req.body)
        if found:
            by_run[int(found.group(1))] = idx
    latency: list[float] = []
    added_gap: list[float] = []
    slip: list[float] = []
    for i, tr in transcripts.items():
        assert tr.end_stream == {}, tr.end_stream
        sent = b.provider.chunk_times[by_run[i]][1 : 1 + deltas]
        assert len(tr.deltas) == len(sent) == deltas and tr.text() == "".join(texts)
        lat = [a - s for a, s in zip(tr.deltas, sent, strict=True)]
        latency += lat
        added_gap += [y - x for x, y in itertools.pairwise(lat)]
        slip += [y - x - gap_s for x, y in itertools.pairwise(sent)]
    return ConcurrencyStats(
        latency,
        added_gap,
        slip,
        wall1 - wall0,
        cpu1 - cpu0,
        daemon1 - daemon0 if b.pid is not None else None,
        rss_samples,
    )
