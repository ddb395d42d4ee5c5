"""Fault injection: hundreds of randomized runs against ONE real daemon, each checked to end with
exactly one correct terminal frame, with the history invariants checked after every run.

Faults (one per run, drawn from a fixed-seed RNG so a failure replays with the same plan;
BYOK_FAULT_SEED / BYOK_FAULT_RUNS override): provider 5xx/429 (retried) and 400 / repeated 5xx
(final), slow headers, truncated stream, invalid JSON, mid-stream disconnect (before output:
retried; after: final), client dropping RunSSE (mid-run or just before the end frame, reconnecting
in the grace; or past the grace), KV ACK missing or failed, cancel at a random point, preemption
by a second run of the conversation, tool rounds with late and repeated Exec results, a store
that refuses every write from a random point of the run on (a full or read-only disk), a
graceful restart of the daemon after a run, its shutdown in the middle of one, the edit of an
earlier user message, MCP calls that fail (the client's MCP state in error or thrown, a tool's
error or rejection, a call the run's definition table does not know), interaction queries
answered late or twice and approvals rejected, compactions (before the first call, after a tool
round, after a request the provider found too long, summarize_action) that succeed, fail, or are
cancelled, dropped or shut down mid-summary (tests/support/fault_compaction.py), and subagents
whose child run fails, is cancelled, loses its stream or is stopped with its parent, and
background completions sent twice (tests/support/fault_subagents.py). On top, any run may post
every BidiAppend twice, post appends out of order (a heartbeat at seqno n+1 before the message
at n), or post its run_request before opening RunSSE. The six conversations run on the three
provider kinds (Chat, Responses, Anthropic: tests/support/fault_kinds.py), some turns with
reasoning to replay.

Checked after every run, from SQLite (a second connection on the daemon's file) and from the
FakeProvider's recorded requests (tests/support/fault_checks.py):
  * exactly one terminal frame over all of the request's RunSSE streams, the expected one, and
    the run record agrees with it (status, error code);
  * the conversation head only grows (an edit keeps what precedes the edited message, which is
    gone; a compaction starts it over with its summary, the older revision intact) and holds
    each committed final answer;
  * runtime event ids are unique, and a run that succeeded or failed committed its runtime
    message exactly once (a cancelled run at most once);
  * every tool result answers an earlier call, at most one result per call;
  * no provider request has a dangling tool call or a duplicated message, and consecutive
    provider requests of a conversation extend each other (prefix property; an edit starts a
    branch, and on Anthropic a user turn after an unanswered one joins its message).
And once, at the end, from the daemon's own call records: every provider call of a conversation
extends its previous one byte for byte, across the restarts too (where a turn's request starts
from the history's stored render), the same two cases aside and two around a compaction; a call
is left uncompared exactly when it is the first on a new summary.

Each client sends the last checkpoint it got with its next run_request, as Cursor does.
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from byok.config_load import load_config
from byok.daemon import run_daemon
from byok.devtools import sim_mcp
from byok.devtools.cursor_sim import RUN_SSE, CursorSim
from byok.devtools.sim_mcp import SimMcp
from byok.http.connect_envelope import encode_frame
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.replay import read_log, replay
from byok.run.upkeep import FULL_COLLECTIONS_OFF
from byok.store import DB_FILENAME, SQLiteStore
from tests.integration.conftest import write_config
from tests.support.fake_provider import (
    Script,
    error_script,
    sse,
)
from tests.support.fault_checks import RenderUses, check_call_records, check_run
from tests.support.fault_compaction import SetupFailed, compaction
from tests.support.fault_harness import (
    GRACE_S,
    MAX_TRIES,
    OK,
    Client,
    Daemon,
    Expect,
    FaultProvider,
    Harness,
    SlowScript,
    cancel_message,
    drive,
    outcome,
    run_request,
    text_script,
)
from tests.support.fault_interactions import interaction_plan
from tests.support.fault_kinds import MODELS, Kind, kind_of
from tests.support.fault_subagents import background, subagent

SEED = int(os.environ.get("BYOK_FAULT_SEED", "6061"))
RUNS = int(os.environ.get("BYOK_FAULT_RUNS", "300"))
# A comma-separated list of the faults to draw from (all of FAULTS when unset): to work on a few.
ONLY = frozenset(filter(None, os.environ.get("BYOK_FAULT_ONLY", "").split(",")))
CONVERSATIONS = 6
KV_TIMEOUT_S = 1.0  # kv_ack_timeout_s: pauses of a loaded CI run (a full suite in one process) passed 0.3 s
SHUTDOWN_GRACE_S = 0.1  # shutdown_grace_s: a run still going after it is cancelled
RUN_TIMEOUT_S = 10.0  # a run still going after this is a hang
# The whole loop: 300 runs ran past 120 s with the two cores shared by several test processes
# (150 runs took 86-96 s then). A hang is RUN_TIMEOUT_S's to find; this bounds a loop gone slow.
LOOP_BUDGET_S = 360.0 * max(1.0, RUNS / 300)

MAX_BODY = 128 * 1024  # max_body_bytes: big.txt's Read result (hex) is over it
SERVER = f"""kv_ack_timeout_s = {KV_TIMEOUT_S}
max_body_bytes = {MAX_BODY}
provider_retry_base_s = 0.002
provider_max_tries = {MAX_TRIES}
reconnect_grace_s = {GRACE_S}
shutdown_grace_s = {SHUTDOWN_GRACE_S}
heartbeat_s = 0.5"""

# fault -> weight. Kept small per run: most runs take tens of milliseconds.
FAULTS = {
    "ok": 10,
    "tool_round": 9,
    "http_retried": 5,  # 500/502/503/429 once, then a good stream
    "http_final": 4,  # 400, or 503 on every try
    "slow_headers": 3,
    "truncated": 4,  # clean EOF before finish/usage
    "invalid_json": 3,
    "disconnect_before_output": 3,  # connection cut after the role chunk: retried
    "disconnect_mid_stream": 4,  # cut after text was shown: final
    "duplicate_call_ids": 2,  # two tool calls of one id: a round that could never complete
    "oversized_result": 2,  # a Read result over max_body_bytes: that exec fails, the run goes on
    "drop_reconnect": 6,  # RunSSE dropped, reopened within the grace
    "drop_expire": 2,  # RunSSE dropped past the grace: the run is cancelled
    "kv_missing": 3,
    "kv_failed": 3,
    "cancel": 6,
    "preempt": 4,
    "store_refuses": 3,  # the disk refuses every write after the run's first 0-3: ends ok or internal
    "restart": 2,  # a turn, then a graceful restart: the next turns start from what the store kept
    "shutdown_mid_run": 2,  # the daemon stops while the run streams: it finishes in the grace or is cancelled
    "edit": 3,  # an earlier user message sent again (its message_id), new text: the history branches
    "mcp_error": 3,  # an MCP state or tool call that fails: the call's error result, the run goes on
    "interaction": 4,  # AskQuestion answered (maybe late, maybe twice), a WebFetch or SwitchMode rejected
    # Compaction (tests/support/fault_compaction.py): before the first call, after a tool round,
    # after the provider found the request too long, or summarize_action ...
    "compaction": 4,  # ... that succeeds (sometimes followed by a restart)
    "compaction_fails": 3,  # ... whose call fails, is cut, or writes nothing: the history is unchanged
    "compaction_cancel": 3,  # ... cancelled, dropped, shut down or not acknowledged mid-summary
    # Subagents (tests/support/fault_subagents.py): a Task whose child run fails, is cancelled,
    # loses its stream, or is stopped with its parent; the Task ends with a result, nothing hangs.
    "subagent": 4,
    "subagent_background": 2,  # a background child, its completion sent twice: appended once
}


async def run_plan(h: Harness, rng: random.Random, index: int) -> tuple[str, list[Expect]]:
    mix = {f: w for f, w in FAULTS.items() if not ONLY or f in ONLY}
    fault = rng.choices(list(mix), weights=list(mix.values()))[0]
    conv = f"fi-conv-{rng.randrange(CONVERSATIONS)}"
    k = kind_of(conv)
    think = f"{index} thought" if rng.random() < 0.4 else None  # reasoning to replay, when it is kept
    tag = f"r{index}"
    answer = [f"{tag} answer ", f"part {rng.randrange(10**6)}"]
    final_text = "".join(answer)
    client = Client(
        h,
        f"fi-req-{index}",
        dup=rng.random() < 0.25,
        reorder=rng.random() < 0.25,
    )
    append_first = rng.random() < 0.2
    expect = Expect(client, frozenset({OK}), conv, final_text)
    p = h.provider
    text = f"{tag}: {fault}"

    if fault == "ok":
        p.enqueue(k.text(answer, think=think))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "tool_round":
        calls = [(f"{tag}-c{i}", "Read", json.dumps({"path": "a.txt"})) for i in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            # Arguments that are not JSON: a model's slip on the OpenAI kinds (the call gets an
            # error result), impossible from Anthropic, whose stream would be rejected.
            broken = rng.random() < 0.5 and k.name != "anthropic"
            calls.append((f"{tag}-bad", rng.choice(["Nope", "Read"]), "{" if broken else "{}"))
        client.exec_delay = rng.choice([0.0, 0.0, 0.01, 0.05])
        client.late_duplicates = rng.random() < 0.4
        # Each call's reasoning is its own (a provider never sends the same encrypted content twice).
        first_think = None if think is None else f"{think} before the tools"
        p.enqueue(k.tools(calls, think=first_think), k.text(answer, think=think))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "http_retried":
        status = rng.choice([500, 502, 503, 429])
        p.enqueue(
            error_script(status, "injected", retry_after="0" if status == 429 else None), k.text(answer)
        )
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "http_final":
        if rng.random() < 0.5:
            p.enqueue(error_script(400, "injected bad request"))
        else:
            p.enqueue(*[error_script(503, "injected overload") for _ in range(MAX_TRIES)])
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "slow_headers":
        good = k.text(answer)
        p.enqueue(SlowScript(chunks=good.chunks, headers_delay_s=rng.choice([0.02, 0.08, 0.15])))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "truncated":
        good = k.text(answer)
        cut = rng.randint(1, k.finish_at(good))  # ends before the finish chunk and usage
        p.enqueue(Script(chunks=good.chunks[:cut]))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "invalid_json":
        good = k.text(answer)
        at = rng.randint(1, len(good.chunks) - 1)
        bad = rng.choice([b"data: {not json\n\n", b"data: [1,\n\n", sse({"choices": "x"}) + b"data: }\n\n"])
        p.enqueue(Script(chunks=[*good.chunks[:at], bad, *good.chunks[at:]]))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "disconnect_before_output":
        good = k.text(answer)
        p.enqueue(Script(chunks=good.chunks, close_after=k.first_output(good, answer)), k.text(answer))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "duplicate_call_ids":
        same = f"{tag}-c0"
        p.enqueue(k.tools([(same, "Read", '{"path":"a.txt"}'), (same, "Grep", '{"pattern":"a"}')]))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "oversized_result":
        big, small = f"{tag}-big", f"{tag}-c1"
        p.enqueue(
            k.tools([(big, "Read", '{"path":"big.txt"}'), (small, "Read", '{"path":"a.txt"}')]),
            k.text(answer),
        )
        expect.tool_error = (big, "max_body_bytes")
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "store_refuses":
        p.enqueue(k.text(answer))
        expect.outcomes = frozenset({OK, "internal"})
        expect.store_refused = True
        h.disk.refuse_from_now(rng.randint(0, 3))
        try:
            await drive(h, client, conv, text, append_first=append_first)
        finally:
            h.disk.refuse_after = None
    elif fault == "disconnect_mid_stream":
        good = k.text(answer)
        shown = k.first_output(good, answer) + 1
        p.enqueue(Script(chunks=good.chunks, close_after=rng.randint(shown, len(good.chunks) - 1)))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "drop_reconnect":
        words = [f"{tag} w{i} " for i in range(6)]
        if rng.random() < 0.4:
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')], delay_s=0.01))
            client.exec_delay = rng.choice([0.0, 0.05])
        p.enqueue(k.text(words, delay_s=0.01))
        expect.final_text = "".join(words)
        # Early: mid-run, the rest of the run goes to the reconnect. Late: at turn_ended or one of
        # the three checkpoints after it, the last of them just before the end frame: the end
        # frame is often written to the dropped stream before the server sees it gone, and the
        # reconnect must carry it again (test_a_reconnect_after_the_run_ended_gets_the_end_frame
        # is the deterministic case). No tolerance: a reconnect without the end frame fails.
        await drive(
            h,
            client,
            conv,
            text,
            append_first=append_first,
            drop_after=rng.randint(1, 4),
            drop_from="interaction_update.turn_ended" if rng.random() < 0.5 else None,
            reconnect_after=rng.choice([0.0, 0.02, 0.08]),
        )
    elif fault == "drop_expire":
        words = [f"{tag} w{i} " for i in range(10)]
        p.enqueue(k.text(words, delay_s=0.06))  # ~0.6 s: outlives the grace
        expect.outcomes = frozenset({"canceled"})
        await drive(
            h, client, conv, text, append_first=append_first, drop_after=1, reconnect_after=GRACE_S + 0.25
        )
    elif fault in ("kv_missing", "kv_failed"):
        client.kv = "missing" if fault == "kv_missing" else "fail"
        if rng.random() < 0.5:  # a tool round publishes its staged checkpoint first
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')]), k.text(answer))
        else:
            p.enqueue(k.text(answer))
        expect.outcomes = frozenset({"internal"})
        expect.final_text = None
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "cancel":
        words = [f"{tag} w{i} " for i in range(6)]
        if rng.random() < 0.4:
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')], delay_s=0.01))
            client.exec_delay = 0.03
        p.enqueue(k.text(words, delay_s=0.01))
        expect.final_text = "".join(words)
        expect.outcomes = frozenset({"canceled", OK})  # OK: the run ended before the cancel landed
        delay = rng.uniform(0.0, 0.15)

        async def cancel_later() -> None:
            await trio.sleep(delay)
            await client.send(cancel_message())

        await drive(h, client, conv, text, append_first=append_first, during=cancel_later)
    elif fault == "preempt":
        first = Client(h, f"fi-req-{index}a", dup=client.dup, reorder=client.reorder)
        words = [f"{tag} slow{i} " for i in range(8)]
        style = rng.choice(["hang", "slow", "tool_round"])
        if style == "hang":
            p.enqueue(Script(hang_before_headers=True))
        elif style == "slow":
            p.enqueue(k.text(words, delay_s=0.04))
        else:  # preempted in the middle of its tool round: calls committed, results maybe not
            calls = [(f"{tag}-p{i}", "Read", '{"path":"a.txt"}') for i in range(2)]
            p.enqueue(k.tools(calls))
            first.exec_delay = 0.3
        p.enqueue(k.text(answer))
        seen = len(p.requests)

        async def second() -> None:
            await p.requested_since(seen)  # the first run's provider call is under way
            await trio.sleep(rng.uniform(0.0, 0.05))
            await drive(h, client, conv, f"{text} (second)", append_first=append_first)

        async with trio.open_nursery() as n:
            n.start_soon(lambda: drive(h, first, conv, f"{text} (first)", append_first=False))
            n.start_soon(second)
        return fault, [Expect(first, frozenset({"canceled", OK}), conv, None), expect]
    elif fault == "interaction":
        calls, client.asking, holds = interaction_plan(rng, tag)
        p.enqueue(k.tools(calls), k.text(answer, think=think))
        expect.tool_error = (calls[0][0], holds)
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "edit":
        held = {m.event_id for m in h.heads.get(conv, ())}
        targets = [(mid, rid) for mid, rid in h.sent.get(conv, []) if f"run-request:{rid}" in held]
        p.enqueue(k.text(answer, think=think))
        message_id, state = None, None
        if targets:
            message_id, expect.edit_of = rng.choice(targets)
            h.edit_texts.add(text)
            state = h.request_states.get(expect.edit_of)  # as Cursor restores it for an edit
        await drive(h, client, conv, text, append_first=append_first, message_id=message_id, state=state)
    elif fault == "mcp_error":
        await mcp_error(h, client, rng, k, tag, answer, expect, conv, text, append_first)
    elif fault.startswith("compaction"):
        return fault, await compaction(h, rng, fault, k, index, conv, client, append_first)
    elif fault == "subagent":
        return fault, await subagent(h, rng, k, index, conv, client, expect, append_first)
    elif fault == "subagent_background":
        return fault, await background(h, rng, k, index, conv, client, expect, append_first)
    elif fault == "restart":
        p.enqueue(k.text(answer))
        await drive(h, client, conv, text, append_first=append_first)
        await h.restart()
    elif fault == "shutdown_mid_run":
        words = [f"{tag} w{i} " for i in range(8)]
        if rng.random() < 0.3:
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')], delay_s=0.01))
            client.exec_delay = rng.choice([0.0, 0.05])
        p.enqueue(k.text(words, delay_s=0.02))
        expect.final_text = "".join(words)
        expect.outcomes = frozenset({"canceled", OK})  # OK: it ended within shutdown_grace_s
        client.server_may_stop = True
        seen = len(p.requests)
        delay = rng.uniform(0.0, 0.15)

        async def stop_later() -> None:
            await p.requested_since(seen)  # the run's provider call is under way
            await trio.sleep(delay)
            await h.restart()

        await drive(h, client, conv, text, append_first=append_first, during=stop_later)
    else:  # pragma: no cover
        raise AssertionError(fault)
    return fault, [expect]


async def mcp_error(
    h: Harness,
    client: Client,
    rng: random.Random,
    k: Kind,
    tag: str,
    answer: list[str],
    expect: Expect,
    conv: str,
    text: str,
    append_first: bool,
) -> None:
    """An MCP call that fails one way or another: its error is the call's result and the turn
    ends with the model's answer."""
    client.mcp = mcp = SimMcp()
    get, call = f"{tag}-get", f"{tag}-mcp"
    add = json.dumps({"server": sim_mcp.SERVER, "toolName": "add_note", "arguments": {"text": tag}})
    how = rng.choice(["state_error", "state_throw", "tool_error", "rejected", "unknown"])
    p = h.provider
    if how == "unknown":  # CallMcpTool with no GetMcpTools in this run: refused, no Exec
        p.enqueue(k.tools([(call, "CallMcpTool", add)]), k.text(answer))
        expect.tool_error = (call, "call GetMcpTools")
    elif how in ("state_error", "state_throw"):
        mcp.state = how.removeprefix("state_")
        p.enqueue(k.tools([(get, "GetMcpTools", "{}")]), k.text(answer))
        expect.tool_error = (get, "the MCP process crashed" if how == "state_error" else "not available")
    else:
        if how == "tool_error":
            mcp.errors = {"add_note": f"{tag} locked"}
        else:
            mcp.rejected = frozenset({"add_note"})
        listing = json.dumps({"server": sim_mcp.SERVER})
        p.enqueue(
            k.tools([(get, "GetMcpTools", listing)]), k.tools([(call, "CallMcpTool", add)]), k.text(answer)
        )
        expect.tool_error = (call, f"{tag} locked" if how == "tool_error" else "the user said no")
    await drive(h, client, conv, text, append_first=append_first)


# --- the loop ----------------------------------------------------------------------------------------


def replay_all(data_dir: Path, failures: list[str]) -> int:
    """Replay every finished run's input log; a run that does not replay is a failure."""
    replayed = 0
    for path in sorted((data_dir / "runs").glob("*.jsonl")):
        lines = read_log(path)
        if not lines or lines[-1].get("k") != "end":
            continue  # a restart or a kill stopped the run before its end was written
        problems = replay(lines).mismatches()
        if problems:
            failures.append(f"{path.name} does not replay: {problems}")
        replayed += 1
    return replayed


@pytest.fixture
def served_gc() -> Iterator[None]:
    """The collector as `byok serve` sets it: the heap so far frozen, no automatic full
    collection (the upkeep runs them between runs). In a pytest process that has run a thousand
    tests before this one, a full collection walks all of their leftovers: a pause long enough
    for the loop's ACK timeout, which the daemon never meets."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*FULL_COLLECTIONS_OFF)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@pytest.mark.usefixtures("served_gc")
async def test_fault_injection_loop(
    tmp_path: Path, nursery: trio.Nursery, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FaultProvider()
    url = await provider.start(nursery)
    data_dir = tmp_path / "data"
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=data_dir, extra=MODELS.format(url=url))
    text = cfg.read_text()
    text = text.replace("kv_ack_timeout_s = 5.0\nprovider_retry_base_s = 0.01", SERVER)
    assert SERVER in text
    cfg.write_text(text)
    used = RenderUses()  # the turns that started from a stored render
    render_log = logging.getLogger("byok.render")
    monkeypatch.setattr(render_log, "handlers", [*render_log.handlers, used])
    monkeypatch.setattr(render_log, "level", logging.DEBUG)
    config = load_config(cfg, overrides={})
    # Every run keeps its input log: each one that finished must replay (checked at the end).
    daemon = Daemon(attrs.evolve(config, logging=attrs.evolve(config.logging, record_runs=True)), nursery)
    base_url = await daemon.start()
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("alpha\nbeta\n")
    # Its Read result, hex-encoded in the append, is twice MAX_BODY.
    (root / "big.txt").write_text("".join(f"line {i:07d}\n" for i in range(MAX_BODY // 13)))
    rng = random.Random(SEED)
    failures: list[str] = []
    faults: Counter[str] = Counter()
    plans: dict[str, str] = {}  # request id -> its fault
    laps: list[float] = []  # when every 500th run started
    outcomes: Counter[str] = Counter()
    ok_runs = 0
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client:
        with SQLiteStore.open_in(data_dir) as store:
            h = Harness(base_url, client, CursorSim(base_url, client), provider, root, store, daemon=daemon)
            h.disk.patch(monkeypatch)
            with trio.fail_after(LOOP_BUDGET_S):
                for index in range(RUNS):
                    if index and index % 500 == 0:  # the loop's pace (the last lap holds the end checks)
                        laps.append(time.monotonic())
                    errors: list[str] = []
                    fault = "?"
                    try:
                        with trio.fail_after(RUN_TIMEOUT_S):
                            fault, expects = await run_plan(h, rng, index)
                        errors = await check_run(h, expects)
                        for e in expects:
                            outcomes[e.got or "none"] += 1
                    except trio.TooSlowError:
                        errors = [f"run {index} ({fault}) did not end within {RUN_TIMEOUT_S}s"]
                    except SetupFailed as e:
                        fault, errors = "compaction", [f"its first turn failed: {e}"]
                    faults[fault] += 1
                    plans[f"fi-req-{index}"] = fault
                    provider.drop_unused()  # scripts a cancelled run never asked for
                    if errors:
                        failures += [f"run {index} [{fault}]: {err}" for err in errors]
                    else:
                        ok_runs += 1
            await daemon.halt()  # its call records are all written now
    with sqlite3.connect(data_dir / DB_FILENAME) as db:
        meter = check_call_records(db, h.edit_texts, plans, h.arrivals, daemon.started_ms)
        failures += meter.errors
        renders = db.execute("SELECT count(*) FROM rendered_prefixes").fetchone()[0]
    replayed = replay_all(data_dir, failures)
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\nfault injection: seed {SEED}, {elapsed:.1f}s; faults {dict(sorted(faults.items()))}; "
            f"terminals {dict(sorted(outcomes.items()))}; provider requests {len(provider.requests)} "
            f"({h.prefix_checks} prefix-checked, {h.tool_requests} carrying tool results); "
            f"{daemon.starts} daemon starts, {renders} stored renders, {len(used.records)} turns started "
            f"from one; the meter compared {meter.compared} calls with their previous one: all extend it "
            f"byte for byte but {meter.branched} edits' first calls, {meter.merged} Anthropic calls "
            f"whose last message took the next user turn and {meter.unrecorded} after a request whose "
            f"record the refusing disk lost, {meter.around} around a compaction (after a request too "
            f"long, after one that wrote no summary); {meter.summaries} first calls on a new summary "
            f"not compared"
        )
        if laps:
            edges = [started, *laps, time.monotonic()]
            print("seconds per 500 runs: " + ", ".join(f"{b - a:.0f}" for a, b in itertools.pairwise(edges)))
        if h.variants:
            print("variants: " + ", ".join(f"{v} {n}" for v, n in sorted(h.variants.items())))
        print(f"{RUNS} runs, {ok_runs} ok; {replayed} replayed from their input logs")
    assert not failures, "\n".join(failures[:40])


# --- bugs the loop found, pinned deterministically ------------------------------------------------------


async def _run_with_a_silent_first_stream(h: Harness, c: Client, conversation_id: str) -> None:
    """Start the run with a first RunSSE nobody reads, then stream it again on a second one."""
    body = encode_frame(bytes(aiserver.BidiRequestId(request_id=c.rid)))
    async with (
        trio.open_nursery() as execs,
        h.client.stream(
            "POST",
            h.base_url + RUN_SSE,
            content=body,
            headers={"content-type": "application/connect+proto"},
        ),
    ):
        await c.start(run_request(h, conversation_id, "hi"))
        await trio.sleep(0.3)
        with trio.fail_after(5):
            await c.stream(execs)


async def test_frames_written_to_a_dead_runsse_are_not_lost_on_reconnect(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    provider = FaultProvider()
    url = await provider.start(nursery)
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
    cfg.write_text(
        cfg.read_text().replace("kv_ack_timeout_s = 5.0", "kv_ack_timeout_s = 1.0\nreconnect_grace_s = 5")
    )
    base_url, stop = await nursery.start(run_daemon, load_config(cfg, overrides={}))
    provider.enqueue(text_script(["hello"]))
    async with httpx.AsyncClient(timeout=30) as client:
        h = Harness(
            base_url,
            client,
            CursorSim(base_url, client),
            provider,
            tmp_path,
            SQLiteStore.open_in(tmp_path / "data"),
        )
        c = Client(h, "req-dead-stream")
        # The first RunSSE goes silent (a dead network path: nothing is read from it any more)
        # while the run writes its KV SETs into it; then the client reconnects.
        await _run_with_a_silent_first_stream(h, c, "conv-dead")
        h.store.close()
    stop()
    assert c.terminals == [{}]


async def test_an_empty_exec_control_message_does_not_stop_the_daemon(tmp_path: Path) -> None:
    crashed: list[BaseException] = []
    try:
        async with trio.open_nursery() as n:
            provider = FaultProvider()
            url = await provider.start(n)
            cfg = tmp_path / "byok.toml"
            write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
            base_url, stop = await n.start(run_daemon, load_config(cfg, overrides={}))
            provider.enqueue(Script(hang_before_headers=True), text_script(["still here"]))
            async with httpx.AsyncClient(timeout=30) as client:
                h = Harness(base_url, client, CursorSim(base_url, client), provider, tmp_path, None)  # type: ignore[arg-type]
                bad = Client(h, "req-bad-control")
                async with trio.open_nursery() as execs:
                    execs.start_soon(bad.stream, execs)
                    await bad.start(run_request(h, "conv-bad", "hi"))
                    # The run waits on the hanging provider call: the next script is the good run's.
                    with trio.fail_after(5):
                        while not provider.requests:
                            await trio.sleep(0.01)
                    await bad.send(
                        agent.AgentClientMessage(exec_client_control_message=agent.ExecClientControlMessage())
                    )
                    await trio.sleep(0.2)
                    await bad.send(cancel_message())
                    with trio.fail_after(5):
                        while not bad.terminals:
                            await trio.sleep(0.01)
                    execs.cancel_scope.cancel()
                good = Client(h, "req-after")
                with trio.fail_after(10):
                    await drive(h, good, "conv-good", "again", append_first=False)
            stop()
            n.cancel_scope.cancel()
    except BaseException as e:  # the daemon's nursery re-raises the run's AttributeError
        crashed.append(e)
    assert not crashed, repr(crashed[0])[:300]
    assert good.terminals == [{}]


async def test_type_confused_run_request_is_answered_invalid_argument(daemon: Any) -> None:
    data = bytes([0x08, 0x05]).hex()  # AgentClientMessage field 1 (run_request), wire type varint, 5
    body = bytes(
        aiserver.BidiAppendRequest(
            data=data, request_id=aiserver.BidiRequestId(request_id="req-x"), append_seqno=0
        )
    )
    resp = await daemon.client.post(
        daemon.base_url + "/aiserver.v1.BidiService/BidiAppend",
        content=body,
        headers={"content-type": "application/proto"},
    )
    # Not a well-typed AgentClientMessage, for a request id byok does not know: CLARIFICATIONS §1
    # says it belongs to another stream and is relayed (upstream is unreachable in this fixture).
    # What matters: a Connect answer, never an HTTP 500.
    assert resp.status_code == 502 and resp.json()["code"] == "unavailable"
    # On a request id that is an agent run (a RunSSE is open for it) the same data is rejected.
    async with trio.open_nursery() as nursery:
        opened = trio.Event()

        async def runsse() -> None:
            async with daemon.client.stream(
                "POST",
                daemon.base_url + "/agent.v1.AgentService/RunSSE",
                content=bytes(aiserver.BidiRequestId(request_id="req-y")),
                headers={"content-type": "application/proto"},
            ) as r:
                opened.set()
                async for _ in r.aiter_bytes():
                    pass

        nursery.start_soon(runsse)
        await opened.wait()
        agent_body = bytes(
            aiserver.BidiAppendRequest(
                data=data, request_id=aiserver.BidiRequestId(request_id="req-y"), append_seqno=0
            )
        )
        resp = await daemon.client.post(
            daemon.base_url + "/aiserver.v1.BidiService/BidiAppend",
            content=agent_body,
            headers={"content-type": "application/proto"},
        )
        assert resp.status_code == 400 and resp.json()["code"] == "invalid_argument"
        nursery.cancel_scope.cancel()


async def test_a_reconnect_after_the_run_ended_gets_the_end_frame(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    provider = FaultProvider()
    url = await provider.start(nursery)
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
    cfg.write_text(
        cfg.read_text().replace("kv_ack_timeout_s = 5.0", "kv_ack_timeout_s = 5.0\nreconnect_grace_s = 5")
    )
    base_url, stop = await nursery.start(run_daemon, load_config(cfg, overrides={}))
    provider.enqueue(error_script(400, "injected bad request"))  # the run fails at once, before any KV
    async with httpx.AsyncClient(timeout=30) as client:
        h = Harness(base_url, client, CursorSim(base_url, client), provider, tmp_path, None)  # type: ignore[arg-type]
        c = Client(h, "req-end-on-dead-stream")
        # The first RunSSE goes silent while the run fails and writes its end frame into it; then
        # the client reconnects.
        await _run_with_a_silent_first_stream(h, c, "conv-end-dead")
    stop()
    assert c.terminals and outcome(c.terminals[0]) == "unavailable", (c.terminals, c.eof_without_terminal)
