"""kill -9 at every named crash point, then a restart on the same data dir.

For each point in byok.run.crash.POINTS the real daemon runs as a subprocess with
BYOK_CRASH_AT=<point>; the simulated Cursor drives one turn (a Read of a real file, then a final
text) until the daemon SIGKILLs itself. A second daemon, without the crash switch, is then
started on the same data dir and the history invariants are checked through SQLite and through
the simulator: no committed message lost, nothing duplicated, no dangling tool call ever shown
to the provider, the prefix property, the crashed run recorded as interrupted, a resume from the
client's last staged checkpoint and a follow-up turn that both complete.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, Recorded, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.model.messages import Message
from byok.pb.agent import v1 as agent
from byok.run.crash import POINTS
from byok.store import SQLiteStore
from tests.integration.conftest import write_config
from tests.integration.test_cli import ROOT, free_port
from tests.support.fake_provider import FakeProvider, Script, chat_text_script, chat_tool_script

CONV = "conv-crash"
MODEL = "byok-demo"
READ_CALL = ("call_1", "Read", '{"path": "notes.txt"}')


def pre_crash_scripts(point: str) -> list[Script]:
    """Exactly the provider responses the run consumes before it reaches ``point``."""
    if point == "provider_call_planned":
        return []
    if point == "provider_mid_stream":
        words = [f"word{i} " for i in range(25)]
        return [chat_text_script(words, delay_s=0.04)]  # ~1 s if nobody kills the daemon
    scripts = [chat_tool_script([READ_CALL])]
    if point == "turn_ended_sent":
        scripts.append(chat_text_script(["The file says alpha."]))
    return scripts


# Points the run may pass with its next provider call already made: the call goes out while the
# client answers the settled checkpoint's blob SETs (runner.Run._call_model). Its script is
# enqueued beside the ones above; whether it was asked for by the crash is timing.
IN_FLIGHT: dict[str, Script] = {
    "settled_checkpoint_sent": chat_text_script(["word "] * 25, delay_s=0.04),
}


# What the head holds when the daemon dies (role, tool call ids / tool_call_id).
EXPECTED_HEAD: dict[str, list[tuple[str, str]]] = {
    "provider_call_planned": [("user", "")],
    "provider_mid_stream": [("user", "")],  # a partial answer is never committed
    "blobs_acked": [("user", ""), ("assistant", "call_1")],
    "tool_result_committed": [("user", ""), ("assistant", "call_1"), ("tool", "call_1")],
    "settled_checkpoint_sent": [("user", ""), ("assistant", "call_1"), ("tool", "call_1")],
    "turn_ended_sent": [("user", ""), ("assistant", "call_1"), ("tool", "call_1"), ("assistant", "")],
}


# Whether the client must hold the tool round's staged checkpoint (pending = the assistant with
# call_1) when the daemon dies. Frames on the RunSSE stream arrive in the order they were sent
# and the simulator records each one before it runs an Exec from a later frame. The staged
# checkpoint is sent before the round's Exec (runner.Run._tool_round), so once the daemon has
# committed the Exec's result, the client had already recorded the staged checkpoint. Frames sent
# just before the SIGKILL may not reach the client, so only those points guarantee it:
EXPECTED_STAGED: dict[str, bool] = {
    "provider_call_planned": False,  # no tool round yet
    "provider_mid_stream": False,  # no tool round yet
    "blobs_acked": False,  # dies after the staged checkpoint's blobs are ACKed, before it is sent
    "tool_result_committed": True,  # the Exec was answered: the staged checkpoint came before it
    "settled_checkpoint_sent": True,  # the result was committed before this point
    "turn_ended_sent": True,  # the round completed; the turn-end staged checkpoint was not sent
}
assert set(EXPECTED_STAGED) == set(POINTS) == set(EXPECTED_HEAD)


def shape(messages: tuple[Message, ...]) -> list[tuple[str, str]]:
    return [(m.role, m.tool_call_id or ",".join(c.call_id for c in m.tool_calls)) for m in messages]


@attrs.define
class DaemonProc:
    proc: trio.Process
    base_url: str


@asynccontextmanager
async def daemon_process(
    cfg: Path,
    client: httpx.AsyncClient,
    log: Path,
    crash_at: str | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> AsyncIterator[DaemonProc]:
    """`python -m byok serve` on a fresh port; killed (by its own handle) if a test leaves it running.
    ``preexec_fn`` runs in the child before exec (a lower resource limit)."""
    env = {k: v for k, v in os.environ.items() if k != "BYOK_CRASH_AT"}
    if crash_at is not None:
        env["BYOK_CRASH_AT"] = crash_at
    port = free_port()
    with log.open("ab") as err:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "byok", "serve", "--config", str(cfg), "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=preexec_fn,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        with trio.fail_after(20):
            while True:
                assert proc.returncode is None, f"daemon exited early: {log.read_text()}"
                try:
                    if (await client.get(base + "/byok/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await trio.sleep(0.05)
        yield DaemonProc(proc, base)
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.move_on_after(5):
                await proc.wait()


async def drive_until_death(
    sim: CursorSim, request_id: str, request: agent.AgentRunRequest, seen: list[Recorded]
) -> Transcript | None:
    """One turn; returns None when the stream broke (the daemon died), the transcript otherwise."""

    def on_frame(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
        seen.append(rec)
        return []

    tr: Transcript | None = None
    try:
        tr = await sim.run(request_id, request, on_frame=on_frame)
    except* httpx.TransportError:
        pass  # the RunSSE stream or an append broke: the daemon is gone
    return tr


def checkpoints(frames: list[Recorded]) -> list[agent.ConversationStateStructure]:
    return [f.message.conversation_checkpoint_update for f in frames if f.kind == "conversation_checkpoint"]


def resume_request(state: agent.ConversationStateStructure) -> agent.AgentRunRequest:
    return agent.AgentRunRequest(
        conversation_state=state,
        action=agent.ConversationAction(
            resume_action=agent.ResumeAction(request_context=agent.RequestContext())
        ),
        requested_model=agent.RequestedModel(model_id=MODEL),
        conversation_id=CONV,
    )


def dump(messages: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(m, separators=(",", ":"), sort_keys=True) for m in messages]


def assert_no_dangling_or_duplicate(bodies: list[dict[str, Any]]) -> None:
    for n, body in enumerate(bodies):
        msgs = body["messages"]
        results = [m["tool_call_id"] for m in msgs if m.get("role") == "tool"]
        assert len(results) == len(set(results)), f"request {n}: a tool result twice: {results}"
        for i, m in enumerate(msgs):
            for call in m.get("tool_calls") or []:
                later = [r.get("tool_call_id") for r in msgs[i + 1 :] if r.get("role") == "tool"]
                assert call["id"] in later, f"request {n}: dangling tool call {call['id']}"


def is_subsequence(small: list[bytes], big: list[bytes]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


@pytest.mark.parametrize(
    "point",
    POINTS,
)
async def test_kill9_then_restart(point: str, tmp_path: Path, nursery: trio.Nursery) -> None:
    provider = FakeProvider()
    provider_url = await provider.start(nursery)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("alpha\nbeta\n")
    data_dir = tmp_path / "data"
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=provider_url, data_dir=data_dir)
    log = tmp_path / "daemon.log"
    executor = WorkspaceExecutor(ws, shell_timeout_cap_s=5.0)
    scripts = pre_crash_scripts(point)
    provider.enqueue(*scripts)
    if point in IN_FLIGHT:
        provider.enqueue(IN_FLIGHT[point])
    seen: list[Recorded] = []

    async with httpx.AsyncClient(timeout=15) as client:
        # --- 1. the crash ---------------------------------------------------------------------
        async with daemon_process(cfg, client, log, crash_at=point) as d1:
            sim = CursorSim(d1.base_url, client, executor=executor)
            first = user_turn("read notes", conversation_id=CONV, model_id=MODEL, message_id="m1")
            with trio.fail_after(15):
                tr = await drive_until_death(sim, "req-crash", first, seen)
                assert tr is None or tr.end_stream is None, f"the run ended instead: {tr and tr.end_stream}"
                code = await d1.proc.wait()
            assert code == -signal.SIGKILL, f"exit {code}: {log.read_text()[-2000:]}"
        made = len(provider.requests)
        assert made == len(scripts) or (point in IN_FLIGHT and made == len(scripts) + 1), (
            "the crash came at another provider call"
        )
        provider.drop_unused()  # an in-flight script nobody asked for is not the next call's
        pre_crash_bodies = [r.json for r in provider.requests]

        with SQLiteStore.open_in(data_dir) as store:
            crashed_head = store.head(CONV)
            assert store.run("req-crash").status == "running"  # type: ignore[union-attr]
        assert shape(crashed_head.messages) == EXPECTED_HEAD[point]
        committed = [m.encode() for m in crashed_head.messages]
        seen_checkpoints = checkpoints(seen)
        staged = [c for c in seen_checkpoints if c.pending_tool_calls]
        # The resume half below must run where the client got the round's staged checkpoint.
        assert len(staged) == (1 if EXPECTED_STAGED[point] else 0), [c.pending_tool_calls for c in staged]
        for c in staged:
            (pending,) = (json.loads(p) for p in c.pending_tool_calls)
            assert pending["role"] == "assistant"
            calls = [part["toolCallId"] for part in pending["content"] if part["type"] == "tool-call"]
            assert calls == ["call_1"], pending

        # --- 2. restart on the same data dir --------------------------------------------------
        async with daemon_process(cfg, client, log) as d2:
            with SQLiteStore.open_in(data_dir) as store:
                run = store.run("req-crash")
                assert run is not None and (run.status, run.error_code) == ("error", "aborted")
                assert store.head(CONV) == crashed_head  # start-up touches no history
            sim2 = CursorSim(d2.base_url, client, executor=executor)
            sim2.blobs = sim.blobs  # the client's KV store survives the daemon

            resumed: Transcript | None = None
            if EXPECTED_STAGED[point]:
                provider.enqueue(chat_text_script(["Resumed after the crash."]))
                before = len(provider.requests)
                with trio.fail_after(15):
                    resumed = await sim2.run("req-resume", resume_request(staged[-1]))
                assert resumed.end_stream == {}, resumed.end_stream
                # The staged round's tools ran again; the provider was only asked for the answer.
                assert [e.exec_id for e in resumed.execs] == ["call_1"]
                assert len(provider.requests) == before + 1
                assert resumed.text() == "Resumed after the crash."
                # ...and saw the complete round: the call and the file's content, once.
                msgs = provider.requests[-1].json["messages"]
                (result,) = [m for m in msgs if m.get("role") == "tool"]
                assert result["tool_call_id"] == "call_1" and "alpha" in result["content"]

            provider.enqueue(chat_text_script(["Back again."]))
            last = (resumed.checkpoints() if resumed else seen_checkpoints) or [None]
            follow = user_turn(
                "still there?", conversation_id=CONV, model_id=MODEL, message_id="m2", state=last[-1]
            )
            with trio.fail_after(15):
                tr2 = await sim2.run("req-next", follow)
            assert tr2.end_stream == {}, tr2.end_stream
            assert tr2.text() == "Back again."

            # EndStream goes out before the run's terminal state is written: stop the daemon
            # (SIGTERM waits for active runs) before reading the runs back.
            d2.proc.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                assert await d2.proc.wait() == 0
    await executor.aclose()
    with SQLiteStore.open_in(data_dir) as store:
        head = store.head(CONV)
        old_branch = store.messages_at(crashed_head.revision_id)  # type: ignore[arg-type]
        statuses = {rid: store.run(rid) for rid in ("req-crash", "req-resume", "req-next")}

    # --- 3. the invariants -----------------------------------------------------------------
    final = [m.encode() for m in head.messages]
    branched = final[: len(committed)] != committed
    # No loss: what was committed is still the head's prefix or, after a resume moved the head
    # back, still stored (old revisions stay) and its messages are all on the new head but the
    # ones the resume replaced.
    assert [m.encode() for m in old_branch] == committed
    if branched:
        assert EXPECTED_STAGED[point], "only a resume may branch"
        keep = [m for m in crashed_head.messages if not (m.role == "assistant" and not m.tool_calls)]
        assert is_subsequence([m.encode() for m in keep], final)
    # Nothing duplicated.
    event_ids = [m.event_id for m in head.messages if m.origin == "runtime"]
    assert event_ids == ["run-request:req-crash", "run-request:req-next"]
    results = [(m.tool_round_id, m.tool_call_id) for m in head.messages if m.role == "tool"]
    assert len(results) == len(set(results))
    assert shape(head.messages)[-2:] == [("user", ""), ("assistant", "")]
    # Runs: the crashed one interrupted once, the others succeeded.
    crashed = statuses["req-crash"]
    assert crashed is not None and (crashed.status, crashed.error_code) == ("error", "aborted")
    assert statuses["req-next"] is not None and statuses["req-next"].status == "success"
    if EXPECTED_STAGED[point]:
        assert statuses["req-resume"] is not None and statuses["req-resume"].status == "success"
    # The provider never saw a dangling call or a result twice, before or after the crash.
    bodies = [r.json for r in provider.requests]
    assert_no_dangling_or_duplicate(bodies)
    # Prefix property: each post-restart request extends the last pre-crash one (unbranched).
    post = bodies[len(pre_crash_bodies) :]
    if pre_crash_bodies and not branched:
        before_msgs = dump(pre_crash_bodies[-1]["messages"])
        for body in post:
            assert dump(body["messages"])[: len(before_msgs)] == before_msgs
    for a, b in itertools.pairwise(post):
        assert dump(b["messages"])[: len(a["messages"])] == dump(a["messages"])
