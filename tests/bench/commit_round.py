"""One turn of 8 parallel Reads, one of them 2.2 MB, timed to the settled checkpoint
(benchmarks 4 and 9)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from byok.pb.agent import v1 as agent
from tests.bench.common import turn_request
from tests.bench.driver import PREFIX, Bench
from tests.support.fake_provider import chat_text_script, chat_tool_script

BIG_BYTES = 2_200_000


def big_file(path: Path, rep: int) -> None:
    line = f"rep {rep} " + "x" * 88
    n = -(-BIG_BYTES // (len(line) + 11))  # at least BIG_BYTES
    path.write_text("".join(f"{line} {i:09d}\n" for i in range(n)))


@attrs.frozen
class CommitSample:
    commit: float  # last result append sent -> settled checkpoint frame
    upload: float  # that append's POST until its 200
    to_completed: float  # append sent -> the big call's tool_call_completed frame
    set_bytes: int  # blob bytes SET between the result and the settled checkpoint
    follow_up: float  # settled checkpoint -> the provider answering the next request


# The big result is sent last (the small ones are committed by then): the worst case.
def hold_big(m: agent.ExecServerMessage) -> float:
    return 0.3 if m.exec_id == "call_big" else 0.0


async def commit_round(b: Bench, ws: Path, rep: int) -> CommitSample:
    """One turn: 8 parallel Reads (7 small, 1 of 2.2 MB answered last), then a text answer."""
    big = ws / f"big{rep}.txt"
    big_file(big, rep)
    calls = [(f"call_{k}", "Read", json.dumps({"path": f"small{k}.py"})) for k in range(7)]
    calls.append(("call_big", "Read", json.dumps({"path": big.name})))
    b.provider.enqueue(chat_tool_script(calls), chat_text_script(["done"]))
    idx = len(b.provider.requests)
    rid = f"commit-{rep}"
    tr = await b.sim.run(rid, turn_request("read them all", f"commit-conv-{rep}", f"m-{rid}"))
    assert tr.end_stream == {}, tr.end_stream
    PREFIX.add(f"4 commit-{rep}", [r.body for r in b.provider.requests[idx:]])
    staged_i, settled_i = [i for i, f in enumerate(tr.frames) if f.kind == "conversation_checkpoint"][:2]
    settled = tr.frames[settled_i]
    results = [
        a
        for a in b.sim.append_log
        if a.request_id == rid and a.kind == "exec_client_message" and a.sent_at < settled.at
    ]
    assert len(results) == 8
    last = max(results, key=lambda a: a.sent_at)
    assert last.size > 2 * BIG_BYTES  # hex: the 2.2 MB result really travelled
    done = next(
        f
        for f in tr.frames[staged_i:settled_i]
        if f.kind == "interaction_update.tool_call_completed"
        and f.message.interaction_update.tool_call_completed.call_id == "call_big"
    )
    sets = [
        f.message.kv_server_message.set_blob_args
        for f in tr.frames[staged_i:settled_i]
        if f.kind == "kv_server_message.set_blob_args" and f.at > last.sent_at
    ]
    # The fake provider answers as soon as it has read a request: its first chunk's time is
    # when the follow-up request (with the 2.2 MB result in it) had arrived.
    follow_up = b.provider.chunk_times[idx + 1][0] - settled.at
    return CommitSample(
        follow_up=follow_up,
        commit=settled.at - last.sent_at,
        upload=last.done_at - last.sent_at,
        to_completed=done.at - last.sent_at,
        set_bytes=sum(len(s.blob_data) for s in sets),
    )
