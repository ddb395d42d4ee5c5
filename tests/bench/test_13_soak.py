"""Bench 13, soak: the daemon's memory across hundreds of turns in many conversations.

byok runs as a service for weeks. Whatever it keeps per run or per conversation beyond its
bounded caches shows up here as RSS that keeps growing after the caches have filled; a service
that leaks 10 KB a turn is 10 MiB fuller after a day of agent work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from tests.bench.common import loadavg, note, size, turn_request, workspace
from tests.bench.driver import child_daemon, report
from tests.support.fake_provider import chat_text_script, chat_tool_script

N_CONVERSATIONS = size(96, 8)  # three times the conversations whose memory is kept (32)
N_ROUNDS = size(6, 3)  # turns per conversation, each a tool round and an answer
WARM_ROUNDS = 2  # the caches fill during these; growth is measured after them
# The daemon drops its caches (decoded histories, request fragments, element digests, idle
# conversations' memory: bounded, but up to ~80 MiB) this long after the last run, so each sample
# shows what it keeps beyond them; sampled once that and the tidy-up after it are done.
IDLE_RELEASE_S = 1.0
# A finished run's slot is kept 120 s for a reconnecting RunSSE; at this pace that is every slot
# of the soak. Kept 1 s here, they are gone by each sample too.
SLOT_LINGER_S = 1.0
SETTLE_S = 2.0


async def test_13_soak(tmp_path: Path, nursery: trio.Nursery) -> None:
    turns = N_CONVERSATIONS * N_ROUNDS
    print(f"\n[13] soak: {N_CONVERSATIONS} conversations x {N_ROUNDS} turns (load {loadavg()})")
    executor = workspace(tmp_path / "ws")
    states: dict[str, object] = {}
    samples: list[tuple[int, int, int]] = []  # (turns done, daemon RSS, its open fds)
    try:
        async with child_daemon(
            tmp_path / "soak",
            nursery,
            idle_release_s=IDLE_RELEASE_S,
            slot_linger_s=SLOT_LINGER_S,
            sim_kwargs={"executor": executor},
        ) as b:
            done = 0
            for r in range(N_ROUNDS):
                for c in range(N_CONVERSATIONS):
                    conv = f"soak-{c}"
                    call = (f"call_{r}_{c}", "Read", json.dumps({"path": f"small{(r + c) % 7}.py"}))
                    b.provider.enqueue(
                        chat_tool_script([call], text="Looking."), chat_text_script([f"Turn {r} of {conv}."])
                    )
                    rid = f"soak-{r}-{c}"
                    request = turn_request(f"round {r}", conv, f"m-{rid}", states.get(conv))  # type: ignore[arg-type]
                    tr = await b.sim.run(rid, request)
                    assert tr.end_stream == {}, tr.end_stream
                    states[conv] = tr.checkpoints()[-1]
                    done += 1
                if r + 1 >= WARM_ROUNDS:
                    await trio.sleep(SETTLE_S)
                    fds = len(os.listdir(f"/proc/{b.pid}/fd"))
                    samples.append((done, b.daemon_rss(), fds))
                    print(f"  after {done} turns: RSS {samples[-1][1] / 2**20:.1f} MiB, {fds} open fds")
    finally:
        await executor.aclose()
    assert len(samples) >= 2
    (n0, rss0, fds0), (n1, rss1, fds1) = samples[0], samples[-1]
    per_1000 = (rss1 - rss0) / 2**20 / (n1 - n0) * 1000
    report(
        "13 soak",
        f"RSS growth per 1,000 turns, caches released ({n1 - n0} turns measured)",
        per_1000,
        "MiB",
        2,
        note=f"RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB",
    )
    report(
        "13 soak",
        "open file descriptors gained per 1,000 turns (sockets, files)",
        (fds1 - fds0) / (n1 - n0) * 1000,
        "fds",
        10,
        note=f"{fds0} -> {fds1}",
    )
    note(
        f"13: {N_CONVERSATIONS} conversations in turn, {turns} turns, each a Read tool round and "
        f"an answer, every turn resuming from the checkpoint its conversation's last one sent. "
        f"The daemon's idle_release_s is {IDLE_RELEASE_S:g} s: RSS is sampled {SETTLE_S:g} s "
        f"after each round of turns, once its caches are dropped and the heap trimmed, from the "
        f"end of round {WARM_ROUNDS} on; a finished run's slot is kept {SLOT_LINGER_S:g} s "
        "instead of 120. Target: 2 MiB per 1,000 turns "
        "(a day of heavy agent use)."
    )
