"""Bench 2: text_delta frames per second through the daemon, and its CPU per frame."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from tests.bench.common import loadavg, note, size, turn_request
from tests.bench.driver import batched, child_daemon, delta_events, harness_gc_off, light_run, ms, report
from tests.support.fake_provider import Script, chat_text_script

N_FRAMES = size(50_000, 5_000)


async def test_2_frame_throughput(tmp_path: Path, nursery: trio.Nursery) -> None:
    print(f"\n[2] frame throughput: {N_FRAMES} tiny deltas per run (load {loadavg()})")
    async with child_daemon(tmp_path / "tput", nursery) as b:
        b.provider.enqueue(chat_text_script(["warm"]))
        await b.sim.run("tput-warm", turn_request("warm up", "tput-warm", "m-w"))
        for label, per_chunk in (("100 SSE events per HTTP chunk", 100), ("1 SSE event per HTTP chunk", 1)):
            texts = [f"{i % 100:02d}" for i in range(N_FRAMES)]
            b.provider.enqueue(Script(chunks=batched(delta_events(texts), per_chunk)))
            rid = f"tput-{per_chunk}"
            with harness_gc_off():
                cpu0, daemon0, wall0 = time.process_time(), b.daemon_cpu_s(), time.monotonic()
                tr = await light_run(b.sim, rid, turn_request("stream a lot", rid, f"m-{rid}"))
                cpu1, daemon1, wall1 = time.process_time(), b.daemon_cpu_s(), time.monotonic()
            assert tr.end_stream == {}, tr.end_stream
            at = tr.deltas
            assert len(at) == N_FRAMES and tr.text() == "".join(texts)
            sent = b.sim.run_request_sent(rid)
            rate = N_FRAMES / (at[-1] - at[0])
            daemon_cpu = (daemon1 - daemon0) / N_FRAMES * 1000
            report(
                "2 throughput",
                f"frames/s delivered, {label}",
                rate,
                "frames/s",
                20_000,
                ">=",
                note=f"whole run {wall1 - wall0:.2f} s wall, first frame after {ms(at[0] - sent):.0f} ms",
            )
            report(
                "2 throughput",
                f"daemon CPU per 1,000 frames, {label}",
                daemon_cpu * 1000,
                "ms",
                note=f"daemon busy {100 * (daemon1 - daemon0) / (wall1 - wall0):.0f}% of a core over the run",
            )
            report(
                "2 throughput",
                f"frames per daemon CPU-second, {label}",
                1000 / daemon_cpu,
                "frames/s",
                20_000,
                ">=",
            )
            report(
                "2 throughput",
                f"  harness CPU per 1,000 frames (client+provider), {label}",
                (cpu1 - cpu0) / N_FRAMES * 1e6,
                "ms",
            )
    note(
        "2: daemon CPU is the child process's utime+stime (/proc/<pid>/stat) over the whole run; "
        "frames/s is text_delta frames over first->last frame arrival at the client; the light "
        "client (see 3) and the provider share the other process."
    )
