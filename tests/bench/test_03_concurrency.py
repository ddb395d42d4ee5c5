"""Bench 3: many simultaneous streaming runs: added inter-event delay, delivery latency, CPU and
RSS per run."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.bench.common import loadavg, note, size, turn_request
from tests.bench.concurrent_runs import DELTA_GAP_S, concurrent_runs
from tests.bench.driver import child_daemon, ms, percentile, report
from tests.support.fake_provider import chat_text_script

N_RUNS = size(100, 20)
N_DELTAS = size(500, 100)


async def test_3_concurrency(tmp_path: Path, nursery: trio.Nursery) -> None:
    print(
        f"\n[3] concurrency: {N_RUNS} runs x {N_DELTAS} deltas at {1 / DELTA_GAP_S:.0f}/s (load {loadavg()})"
    )
    async with child_daemon(tmp_path / "conc", nursery) as b:
        for i in range(3):
            b.provider.enqueue(chat_text_script(["warm"]))
            await b.sim.run(f"conc-warm-{i}", turn_request("warm up", f"conc-warm-{i}", f"m-w{i}"))
        await trio.sleep(0.5)
        rss0 = b.daemon_rss()
        st = await concurrent_runs(b, N_RUNS, N_DELTAS, DELTA_GAP_S, "conc")
        await trio.sleep(1.0)
        rss_idle = b.daemon_rss()
    latency, added_gap, slip, rss_samples = st.latency, st.added_gap, st.slip, st.rss_samples
    assert st.daemon_cpu is not None
    report(
        "3 concurrency",
        f"p99 added inter-event delay ({N_RUNS} runs)",
        ms(percentile(added_gap, 99)),
        "ms",
        20,
    )
    report("3 concurrency", "  p50 added inter-event delay", ms(percentile(added_gap, 50)), "ms")
    report(
        "3 concurrency",
        "  daemon CPU per delivered frame (whole runs incl. turn start/end)",
        st.daemon_cpu / len(latency) * 1e6,
        "us",
        note=f"{len(latency) / st.wall:.0f} frames/s delivered over {st.wall:.1f} s, "
        f"{N_RUNS / DELTA_GAP_S:.0f}/s offered",
    )
    report(
        "3 concurrency",
        "p99 per-event delivery latency (provider send -> client frame)",
        ms(percentile(latency, 99)),
        "ms",
        20,
        note=f"p50 {ms(percentile(latency, 50)):.1f} ms, max {ms(max(latency)):.0f} ms",
    )
    report(
        "3 concurrency", "  provider schedule slip p99 (its own gap - 20 ms)", ms(percentile(slip, 99)), "ms"
    )
    report(
        "3 concurrency",
        "  daemon CPU utilisation during the runs",
        100 * st.daemon_cpu / st.wall,
        "% of a core",
    )
    report(
        "3 concurrency",
        "  harness CPU utilisation (client+provider)",
        100 * st.harness_cpu / st.wall,
        "% of a core",
    )
    report(
        "3 concurrency",
        "RSS per active run (peak RSS - idle RSS before) / runs",
        (max(rss_samples) - rss0) / N_RUNS / 2**20,
        "MiB",
        20,
    )
    report(
        "3 concurrency",
        "RSS per idle conversation (RSS after - before) / conversations",
        (rss_idle - rss0) / N_RUNS / 2**20,
        "MiB",
        5,
    )
    note(
        "3: 'added inter-event delay' is, per consecutive pair of deltas of one run, (client gap) - "
        "(provider's actual send gap); 'delivery latency' is client arrival - provider send of the "
        "same delta (same clock). RSS is the daemon process's VmRSS (/proc/<pid>/statm): getrusage "
        "only reports the peak, and in one process tracemalloc could not tell daemon objects from "
        "the client's. Freed memory is not always returned to the OS, so 'after' is an upper bound. "
        "2 and 3 use a light client (text_delta frames recognised by their first bytes, decoded after "
        "the run) and switch off the harness's cyclic GC while timing, so the harness stays cheap."
    )
