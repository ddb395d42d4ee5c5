"""Bench 13, soak: the daemon's memory across hundreds of turns in many conversations.

byok runs as a service for weeks. Whatever it keeps per run or per conversation beyond its
bounded caches shows up here as RSS that keeps growing; a service that leaks 10 KB a turn is
10 MiB fuller after a day of agent work.

Two phases, each on a daemon of its own. In the first, 96 conversations grow by a turn each
round: the caches stay within their budget, evicting the least recently used conversation at
nearly every turn, and some of what they freed stays resident (freed memory in partly used
allocator arenas). In the second, every turn starts a new conversation: the same turns with no history
growth, so any RSS growth there is memory kept per turn, a leak.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from tests.bench.common import loadavg, note, size, turn_request, workspace
from tests.bench.driver import Bench, child_daemon, report
from tests.support.fake_provider import chat_text_script, chat_tool_script

N_CONVERSATIONS = size(96, 8)
N_ROUNDS = size(6, 3)  # turns per conversation, each a tool round and an answer
WARM_ROUNDS = 2  # the caches fill during these; growth is measured after them
# The daemon's caches (decoded histories, request fragments, element digests, conversations'
# memory) are held to this budget, so each sample shows what it keeps beyond them: at 96
# conversations the budget evicts one at nearly every turn.
CACHE_BYTES = 4 * 2**20
# A finished run's slot is kept 120 s for a reconnecting RunSSE; at this pace that is every slot
# of the soak. Kept 1 s here, they are gone by each sample too.
SLOT_LINGER_S = 1.0
SETTLE_S = 2.0

Sample = tuple[int, int, int]  # (turns done, daemon RSS, its open fds)


async def soak(b: Bench, *, fresh: bool) -> list[Sample]:
    """N_ROUNDS rounds of one turn in each of N_CONVERSATIONS conversations, sampled after each
    round from WARM_ROUNDS on. ``fresh``: every turn in a conversation of its own."""
    states: dict[str, object] = {}
    samples: list[Sample] = []
    done = 0
    for r in range(N_ROUNDS):
        for c in range(N_CONVERSATIONS):
            conv = f"soak-{r}-{c}" if fresh else f"soak-{c}"
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
    assert len(samples) >= 2
    return samples


def growth(samples: list[Sample]) -> tuple[float, float, str, str]:
    """RSS (MiB) and descriptors gained per 1,000 turns from the first sample to the last."""
    (n0, rss0, fds0), (n1, rss1, fds1) = samples[0], samples[-1]
    turns = n1 - n0
    return (
        (rss1 - rss0) / 2**20 / turns * 1000,
        (fds1 - fds0) / turns * 1000,
        f"{turns} turns measured, RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB",
        f"{fds0} -> {fds1}",
    )


async def test_13_soak(tmp_path: Path, nursery: trio.Nursery) -> None:
    turns = N_CONVERSATIONS * N_ROUNDS
    print(f"\n[13] soak: {N_CONVERSATIONS} conversations x {N_ROUNDS} turns (load {loadavg()})")
    executor = workspace(tmp_path / "ws")
    phases: dict[bool, list[Sample]] = {}
    try:
        for fresh in (False, True):
            print("  a new conversation every turn:" if fresh else "  conversations growing a turn a round:")
            async with child_daemon(
                tmp_path / ("soak-fresh" if fresh else "soak"),
                nursery,
                cache_bytes=CACHE_BYTES,
                slot_linger_s=SLOT_LINGER_S,
                sim_kwargs={"executor": executor},
            ) as b:
                phases[fresh] = await soak(b, fresh=fresh)
    finally:
        await executor.aclose()
    rss, fds, rss_note, fds_note = growth(phases[False])
    report(
        "13 soak",
        "RSS growth per 1,000 turns, conversations growing, caches within a 4 MiB budget",
        rss,
        "MiB",
        note=rss_note,
    )
    report("13 soak", "  open file descriptors gained per 1,000 turns", fds, "fds", 10, note=fds_note)
    rss, fds, rss_note, fds_note = growth(phases[True])
    report(
        "13 soak",
        "RSS growth per 1,000 turns, a new conversation every turn (kept per turn)",
        rss,
        "MiB",
        2,
        note=rss_note,
    )
    report("13 soak", "  open file descriptors gained per 1,000 turns", fds, "fds", 10, note=fds_note)
    note(
        f"13: two phases of {turns} turns on daemons of their own, each turn a Read tool round and "
        f"an answer: {N_CONVERSATIONS} conversations in turn, every turn resuming from the "
        "checkpoint its conversation's last one sent; then the same turns each in a new "
        f"conversation. The daemon's cache budget is {CACHE_BYTES / 2**20:g} MiB: RSS is sampled "
        f"{SETTLE_S:g} s after each round of turns, once the heap is trimmed, from the end of "
        f"round {WARM_ROUNDS} on; a finished run's slot is kept {SLOT_LINGER_S:g} s instead of 120. "
        "Target for what is kept per turn: 2 MiB per 1,000 turns (a day of heavy agent use)."
    )
