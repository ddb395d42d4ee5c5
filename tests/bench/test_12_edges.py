"""Bench 12: turn edges, what the user waits for once the model has finished: the first Exec of a
tool round, the next request after its result, and turn_ended."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import trio

from tests.bench.common import loadavg, note, size, turn_request, workspace
from tests.bench.driver import child_daemon, ms, percentile, report
from tests.support.fake_provider import chat_text_script, chat_tool_script

N_EDGES = size(40, 6)


async def test_12_turn_edges(tmp_path: Path, nursery: trio.Nursery) -> None:
    """From the provider's last chunk (its stream complete) to the frame the client acts on: the
    Exec of a tool round's first call, and turn_ended of an answer. Both wait for checkpoint
    blobs the client must ACK one append at a time; the provider streams at 5 ms a chunk, as a
    model does, so what can go out while it streams has."""
    print(f"\n[12] turn edges, x{N_EDGES} (load {loadavg()})")
    ws = tmp_path / "ws"
    executor = workspace(ws)
    ends: list[float] = []
    dispatch: list[float] = []
    settles: list[float] = []
    try:
        async with child_daemon(tmp_path / "edges", nursery, sim_kwargs={"executor": executor}) as b:
            b.provider.enqueue(chat_text_script(["warm"]))
            await b.sim.run("edges-warm", turn_request("warm up", "edges-warm", "m-w"))
            for i in range(N_EDGES):
                idx = len(b.provider.requests)
                b.provider.enqueue(chat_text_script([f"word{k} " for k in range(10)], delay_s=0.005))
                tr = await b.sim.run(f"edges-a{i}", turn_request(f"say it {i}", f"edges-a{i}", f"m-a{i}"))
                assert tr.end_stream == {}, tr.end_stream
                ended = next(f.at for f in tr.frames if f.kind == "interaction_update.turn_ended")
                ends.append(ended - b.provider.chunk_times[idx][-1])
                idx = len(b.provider.requests)
                call = (f"call_e{i}", "Read", json.dumps({"path": "small0.py"}))
                b.provider.enqueue(
                    chat_tool_script([call], text="Let me look.", delay_s=0.005), chat_text_script(["done"])
                )
                tr = await b.sim.run(f"edges-t{i}", turn_request(f"read it {i}", f"edges-t{i}", f"m-t{i}"))
                assert tr.end_stream == {}, tr.end_stream
                first_exec = next(f.at for f in tr.frames if f.kind.startswith("exec_server_message"))
                dispatch.append(first_exec - b.provider.chunk_times[idx][-1])
                result = next(
                    a.sent_at
                    for a in b.sim.append_log
                    if a.request_id == f"edges-t{i}" and a.kind == "exec_client_message"
                )
                # The fake provider answers as soon as it has read a request.
                settles.append(b.provider.chunk_times[idx + 1][0] - result)
    finally:
        await executor.aclose()
    report(
        "12 edges",
        "provider's last chunk -> the first Exec of a tool round, p50",
        ms(statistics.median(dispatch)),
        "ms",
        note=f"p90 {ms(percentile(dispatch, 90)):.1f} ms",
    )
    report(
        "12 edges",
        "the round's result append -> the provider has the next request, p50",
        ms(statistics.median(settles)),
        "ms",
        note=f"p90 {ms(percentile(settles, 90)):.1f} ms",
    )
    report(
        "12 edges",
        "provider's last chunk -> turn_ended of an answer, p50",
        ms(statistics.median(ends)),
        "ms",
        note=f"p90 {ms(percentile(ends, 90)):.1f} ms",
    )
    note(
        "12: fresh conversations. Before the Exec: the assistant's commit, the staged checkpoint's "
        "blob SETs and their ACKs, the checkpoint. From the result (a small Read): its commit and "
        "card, the settled checkpoint's SETs and ACKs, the checkpoint, the next request's render "
        "and upload. Before turn_ended: the answer's commit, the final checkpoints' SETs and "
        "ACKs, the turn ids saved."
    )
