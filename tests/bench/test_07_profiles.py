"""Benchmarks 7-11: pyinstrument profiles of benchmarks 1, 2, 4, 3 and 5 with the daemon in this
process; summaries printed, full trees written under BYOK_BENCH_OUT (/tmp/byok-bench)."""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import pytest
import trio

from byok.store import SQLiteStore
from tests.bench.commit_round import commit_round, hold_big
from tests.bench.common import TEXT_DELTA, measured_turn, size, turn_request, workspace
from tests.bench.concurrent_runs import DELTA_GAP_S, concurrent_runs
from tests.bench.driver import (
    batched,
    bench_daemon,
    delta_events,
    ms,
    percentile,
    report,
    summarize_profile,
    trace_store_calls,
)
from tests.bench.long_history import LONG_CONV, N_BLOCKS, block
from tests.support.fake_provider import Script, chat_text_script


def profiler():  # type: ignore[no-untyped-def]
    pyinstrument = pytest.importorskip("pyinstrument", reason="pip install pyinstrument to profile")
    return pyinstrument.Profiler(interval=0.0005, async_mode="disabled")


# Outside pytest's basetemp, which concurrent pytest runs of the same user prune.
PROFILE_DIR = Path(os.environ.get("BYOK_BENCH_OUT", Path(tempfile.gettempdir()) / "byok-bench"))


def write_profile(name: str, prof, summary: list[str]) -> None:  # type: ignore[no-untyped-def]
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    path = PROFILE_DIR / f"{name}.txt"
    path.write_text("\n".join(summary) + "\n\n" + prof.output_text(unicode=False, color=False))
    for line in summary:
        print("  " + line)
    print(f"  full pyinstrument tree: {path}")


async def test_7_profile_ttft(tmp_path: Path, nursery: trio.Nursery) -> None:
    n = size(60, 10)
    print(f"\n[7] profile of benchmark 1: {n} fresh-conversation turns x2, daemon in this process")
    prof = profiler()
    async with bench_daemon(tmp_path / "prof1", nursery) as b:
        with SQLiteStore.open_in(b.data_dir) as db:
            for i in range(5):
                await measured_turn(b, db, f"pwarm-{i}", f"pwarm-{i}")
            # Pass 1, no profiler: where the time goes between run_request and the first frame.
            with trace_store_calls() as calls:
                traced = [await measured_turn(b, db, f"t-{i}", f"t-conv-{i}") for i in range(n)]
            phases: dict[str, list[float]] = {}
            per_name: dict[str, list[tuple[float, float]]] = {}
            for i, s in enumerate(traced):
                sent = b.sim.run_request_sent(f"t-{i}")
                req_at = b.provider.requests[s.provider_index].at
                first_chunk = b.provider.chunk_times[s.provider_index][1]
                critical = sorted((c for c in calls if sent <= c.start <= req_at), key=lambda c: c.start)
                start, end = critical[0].start, max(c.start + c.wall for c in critical)
                walls = sum(c.wall for c in critical)
                for key, value in (
                    ("BidiAppend sent -> the run's first store call", start - sent),
                    (f"store calls ({len(critical)}, back to back): sum of wall", walls),
                    ("  of which inside the worker thread (SQL + fsync)", sum(c.work for c in critical)),
                    ("  trio thread between store calls", (end - start) - walls),
                    ("last store call -> request at the provider (build + HTTP)", req_at - end),
                    ("provider: request -> first content chunk (also in direct)", first_chunk - req_at),
                    ("provider chunk -> text_delta at the client", s.stream),
                    ("via byok TTFT", s.via),
                    ("direct TTFT", s.direct),
                ):
                    phases.setdefault(key, []).append(value)
                for c in critical:
                    per_name.setdefault(c.name, []).append((c.wall, c.work))
            # Pass 2, profiled.
            prof.start()
            profiled = [await measured_turn(b, db, f"p-{i}", f"p-conv-{i}") for i in range(n)]
            prof.stop()
    summary = summarize_profile(prof.last_session)
    summary.append(f"profiled pass: via-byok TTFT p50 {percentile([ms(s.via) for s in profiled], 50):.1f} ms")
    summary.append("unprofiled pass, TTFT critical path per turn (p50 over turns):")
    for key, values in phases.items():
        summary.append(f"  {ms(percentile(values, 50)):7.2f} ms  {key}")
    summary.append("store calls on that path (median wall / median work in the worker thread):")
    for name, vals in sorted(per_name.items(), key=lambda kv: -statistics.median(v[0] for v in kv[1])):
        summary.append(
            f"  {name:<24} x{len(vals) / n:.1f}  wall {ms(statistics.median(v[0] for v in vals)):6.2f} ms"
            f"  work {ms(statistics.median(v[1] for v in vals)):6.2f} ms"
        )
    write_profile("profile_ttft", prof, summary)
    store_key = next(k for k in phases if k.startswith("store calls"))
    report(
        "7 profile",
        "in-process TTFT path: store calls (sum of wall), p50 per turn",
        ms(percentile(phases[store_key], 50)),
        "ms",
        note=f"of a {ms(percentile(phases['via byok TTFT'], 50)):.1f} ms via-byok TTFT",
    )


async def test_8_profile_throughput(tmp_path: Path, nursery: trio.Nursery) -> None:
    n = size(20_000, 2_000)
    print(f"\n[8] profile of benchmark 2: {n} deltas, 100 per HTTP chunk, daemon in this process")
    prof = profiler()
    async with bench_daemon(tmp_path / "prof2", nursery) as b:
        b.provider.enqueue(chat_text_script(["warm"]))
        await b.sim.run("pt-warm", turn_request("warm up", "pt-warm", "m-w"))
        b.provider.enqueue(Script(chunks=batched(delta_events(["ab"] * n), 100)))
        cpu0 = time.process_time()
        prof.start()
        tr = await b.sim.run("pt", turn_request("stream a lot", "pt", "m-pt"))
        prof.stop()
        cpu = time.process_time() - cpu0
    assert sum(f.kind == TEXT_DELTA for f in tr.frames) == n
    summary = summarize_profile(prof.last_session)
    summary.append(
        f"whole process (daemon + client + provider, profiler on): {cpu / n * 1e6:.0f} us CPU per frame"
    )
    write_profile("profile_throughput", prof, summary)
    report(
        "8 profile",
        "in-process CPU per 1,000 frames, all three sides, profiler on",
        cpu / n * 1000 * 1000,
        "ms",
    )


async def test_9_profile_commit(tmp_path: Path, nursery: trio.Nursery) -> None:
    print("\n[9] profile of benchmark 4: one round of 8 Reads (one 2.2 MB), daemon in this process")
    prof = profiler()
    ws = tmp_path / "ws"
    executor = workspace(ws)
    sim_kwargs = {"executor": executor, "exec_delay": hold_big}
    try:
        async with bench_daemon(tmp_path / "prof4", nursery, sim_kwargs=sim_kwargs) as b:
            await commit_round(b, ws, 100)  # warm-up
            with trace_store_calls() as traced:
                prof.start()
                sample = await commit_round(b, ws, 101)
                prof.stop()
            last = max(
                (
                    a
                    for a in b.sim.append_log
                    if a.request_id == "commit-101" and a.kind == "exec_client_message"
                ),
                key=lambda a: a.sent_at,
            )
            calls = [c for c in traced if last.sent_at <= c.start <= last.sent_at + sample.commit]
    finally:
        await executor.aclose()
    summary = summarize_profile(prof.last_session)
    summary.append(
        f"in-process: last result append -> settled checkpoint {ms(sample.commit):.0f} ms (profiler on)"
    )
    summary.append("store calls between the last result append and the settled checkpoint (wall / worker):")
    for c in calls:
        summary.append(f"  {c.name:<24} wall {ms(c.wall):6.1f} ms  work {ms(c.work):6.1f} ms")
    write_profile("profile_commit", prof, summary)


async def test_10_profile_concurrency(tmp_path: Path, nursery: trio.Nursery) -> None:
    runs, deltas = size(40, 10), size(150, 50)
    print(f"\n[10] profile of benchmark 3: {runs} runs x {deltas} deltas at 50/s, daemon in this process")
    prof = profiler()
    async with bench_daemon(tmp_path / "prof3", nursery) as b:
        b.provider.enqueue(chat_text_script(["warm"]))
        await b.sim.run("pc-warm", turn_request("warm up", "pc-warm", "m-w"))
        prof.start()
        st = await concurrent_runs(b, runs, deltas, DELTA_GAP_S, "pconc")
        prof.stop()
    summary = summarize_profile(prof.last_session)
    summary.append(
        f"in-process, profiler on: delivery latency p50 {ms(percentile(st.latency, 50)):.1f} ms, "
        f"p99 {ms(percentile(st.latency, 99)):.1f} ms over {st.wall:.1f} s"
    )
    write_profile("profile_concurrency", prof, summary)


async def test_11_profile_long_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    print(
        f"\n[11] profile of benchmark 5: the warm turn on a {N_BLOCKS * 10}-message conversation, in process"
    )
    prof = profiler()
    root = tmp_path / "prof5"
    with SQLiteStore.open_in(root / "data") as store:
        version = 0
        for start in range(0, N_BLOCKS, 10):
            msgs = [m for b in range(start, start + 10) for m in block(b)]
            version = store.append(LONG_CONV, version, msgs, 1_700_000_000_000).version
    pauses: list[tuple[int, float, float]] = []  # (generation, seconds, start)
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.monotonic()
        else:
            pauses.append((info["generation"], time.monotonic() - started[0], started[0]))

    async with bench_daemon(root, nursery) as b:
        with SQLiteStore.open_in(b.data_dir) as db:
            cold = await measured_turn(b, db, "pl-1", LONG_CONV)  # loads the history, SETs every root
            gc.callbacks.append(on_gc)
            try:
                with trace_store_calls() as calls:
                    prof.start()
                    warm = await measured_turn(b, db, "pl-2", LONG_CONV, cold.checkpoint)
                    prof.stop()
            finally:
                gc.callbacks.remove(on_gc)
            sent = b.sim.run_request_sent("pl-2")
    summary = summarize_profile(prof.last_session)
    summary.append(
        f"warm turn, profiler on: via-byok TTFT {ms(warm.via):.0f} ms, run_request -> provider request "
        f"{ms(warm.precall):.0f} ms, direct {ms(warm.direct):.0f} ms"
    )
    summary.append("store calls of the turn (ms after run_request: wall / worker):")
    for c in calls:
        summary.append(
            f"  {c.name:<24} at {ms(c.start - sent):7.1f}  wall {ms(c.wall):6.1f}  work {ms(c.work):6.1f}"
        )
    summary.append("cyclic GC pauses >= 5 ms in the process during the turn:")
    for gen, took, at in pauses:
        if took >= 0.005:
            summary.append(f"  generation {gen}: {ms(took):.1f} ms at {ms(at - sent):.0f} ms")
    write_profile("profile_long_turn", prof, summary)
