"""One turn of 8 parallel Reads, one of them 2.2 MB, timed to the settled checkpoint
(benchmarks 4 and 9)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from byok.cursor import encode, proto_decode
from byok.cursor.checkpoint import root_blob
from byok.http.bidi_append import parse_client_message
from byok.http.connect_envelope import decode_unary_body, encode_frame
from byok.model.messages import Message
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.store import SQLiteStore
from tests.bench.common import turn_request
from tests.bench.driver import PREFIX, Bench
from tests.support.fake_provider import chat_text_script, chat_tool_script

BIG_BYTES = 2_200_000


def big_file(path: Path, rep: int) -> None:
    line = f"rep {rep} " + "x" * 88
    n = -(-BIG_BYTES // (len(line) + 11))  # at least BIG_BYTES
    path.write_text("".join(f"{line} {i:09d}\n" for i in range(n)))


@attrs.frozen
class Parts:
    """The daemon's steps between the big result's append and its card, timed in this process with
    byok's own functions on the same bytes (medians of 3)."""

    unwrap: float  # Connect body -> BidiAppendRequest (its 4.4 MB hex string decoded as UTF-8)
    hex: float  # bytes.fromhex of the data
    proto: float  # the AgentClientMessage it holds (proto_decode, checks)
    commit: float  # the result message's root blob (encode + SHA-256) and its SQLite append (FULL)
    card: float  # the tool_call_completed frame around the card's bytes, in its Connect envelope
    card_bytes: int


def timed3(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def split_parts(body: bytes, card: agent.ToolCall, content: str, store_dir: Path) -> Parts:
    """Each step of the daemon's path from the append to the card, on the bytes it handled."""
    raw = decode_unary_body(body, "application/proto", None, max_bytes=64 << 20)
    req = proto_decode.parse(aiserver.BidiAppendRequest, raw)
    unwrap = timed3(
        lambda: proto_decode.parse(
            aiserver.BidiAppendRequest, decode_unary_body(body, "application/proto", None, max_bytes=64 << 20)
        )
    )
    data = bytes.fromhex(req.data)
    hex_s = timed3(lambda: bytes.fromhex(req.data))
    msg = parse_client_message(data)
    assert msg is not None
    proto = timed3(lambda: parse_client_message(data))
    ui = bytes(card)

    with SQLiteStore.open_in(store_dir) as store:
        store.append("warm", 0, [Message(role="user", origin="user", text="warm")], 1)
        # Each a new row (an equal one is not written again), made before the clock starts.
        results = iter(
            Message(
                role="tool", origin="tool", text=f"{content}{k}", tool_call_id="call_big", tool_name="Read"
            )
            for k in range(3)
        )
        made = [next(results) for _ in range(3)]
        todo = iter(enumerate(made))

        def commit() -> None:
            k, message = next(todo)
            root_blob(message)
            store.append(f"c{k}", 0, [message], 1)

        commit_s = timed3(commit)
    card_s = timed3(lambda: encode_frame(encode.tool_call_completed("call_big", ui, "mc")))
    return Parts(unwrap, hex_s, proto, commit_s, card_s, len(ui))


@attrs.frozen
class CommitSample:
    commit: float  # last result append sent -> settled checkpoint frame
    upload: float  # that append's POST until its 200
    to_completed: float  # append sent -> the big call's tool_call_completed frame
    set_bytes: int  # blob bytes SET between the result and the settled checkpoint
    follow_up: float  # settled checkpoint -> the provider answering the next request
    parts: Parts | None = None


# The big result is sent last (the small ones are committed by then): the worst case.
def hold_big(m: agent.ExecServerMessage) -> float:
    return 0.3 if m.exec_id == "call_big" else 0.0


async def commit_round(b: Bench, ws: Path, rep: int, split: bool = False) -> CommitSample:
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
    parts = None
    if split and last.body is not None:
        card = done.message.interaction_update.tool_call_completed.tool_call
        assert card is not None
        parts = split_parts(last.body, card, big.read_text(), ws.parent / f"split-{rep}")
    return CommitSample(
        parts=parts,
        follow_up=follow_up,
        commit=settled.at - last.sent_at,
        upload=last.done_at - last.sent_at,
        to_completed=done.at - last.sent_at,
        set_bytes=sum(len(s.blob_data) for s in sets),
    )
