"""A resume from a checkpoint of a branch the head has left: kill -9 after turn 2's Read round
was settled, restart, re-send turn 2's message (an edit: the head branches back before it),
let that retry fail, then resume from the settled checkpoint the client holds. Every root in
it is byok's own, so the head moves to that point (docs/architecture.md, "Resume") instead of
the run being refused as "ahead of byok's history"."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import trio

from byok.devtools.cursor_sim import CursorSim, Recorded, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.integration.conftest import write_config
from tests.integration.test_crash import checkpoints, daemon_process, shape
from tests.support.fake_provider import FakeProvider, Script, anthropic_text_script, anthropic_tool_script
from tests.support.run_driver import resume_request

CONV = "conv-resume-branch"
MODEL = "byok-demo"
READ = ("toolu_1", "Read", '{"path": "notes.txt"}')


async def test_resume_from_a_settled_checkpoint_after_a_failed_retry(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    provider = FakeProvider()
    url = (await provider.start(nursery)).removesuffix("/v1")  # Anthropic base URLs carry no /v1
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("alpha\nbeta\n")
    data_dir = tmp_path / "data"
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=data_dir, kind="anthropic")
    log = tmp_path / "daemon.log"
    executor = WorkspaceExecutor(ws, shell_timeout_cap_s=5.0)

    async with httpx.AsyncClient(timeout=15) as client:
        # --- turn 1, then turn 2 killed right after its Read round's settled checkpoint ----------
        async with daemon_process(cfg, client, log) as d1:
            sim = CursorSim(d1.base_url, client, executor=executor)
            provider.enqueue(anthropic_text_script(["Hello."]))
            with trio.fail_after(15):
                t1 = await sim.run(
                    "req-1", user_turn("hi", conversation_id=CONV, model_id=MODEL, message_id="m1")
                )
            assert t1.end_stream == {}, t1.end_stream
            after_turn_1 = t1.checkpoints()[-1]

            # The round's next call hangs: nothing after the settled checkpoint is committed.
            provider.enqueue(anthropic_tool_script([READ]), Script(hang_before_headers=True))
            seen: list[Recorded] = []

            def on_frame(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
                seen.append(rec)
                if rec.kind == "conversation_checkpoint" and len(checkpoints(seen)) == 2:
                    # staged, then settled: kill -9 now (BYOK_CRASH_AT's settled_checkpoint_sent
                    # fires with the frame queued, before it reaches the client).
                    d1.proc.send_signal(signal.SIGKILL)
                return []

            turn_2 = user_turn(
                "read notes", conversation_id=CONV, model_id=MODEL, message_id="m2", state=after_turn_1
            )
            with trio.fail_after(15):
                try:
                    await sim.run("req-2", turn_2, on_frame=on_frame)
                except* httpx.TransportError:
                    pass  # the daemon is gone
                assert await d1.proc.wait() == -signal.SIGKILL
        staged, settled = checkpoints(seen)
        assert staged.pending_tool_calls and not settled.pending_tool_calls
        with SQLiteStore.open_in(data_dir) as store:
            crashed = store.head(CONV)
        assert shape(crashed.messages) == [
            ("user", ""),
            ("assistant", ""),
            ("user", ""),
            ("assistant", "toolu_1"),
            ("tool", "toolu_1"),
        ]
        assert len(settled.root_prompt_messages_json) == 1 + len(crashed.messages)  # + the system root
        provider.drop_unused()

        async with daemon_process(cfg, client, log) as d2:
            sim2 = CursorSim(d2.base_url, client, executor=executor)
            sim2.blobs = sim.blobs  # the client's KV store survives the daemon
            # --- the same message again (an edit), its answer cut short -------------------------
            provider.enqueue(anthropic_text_script(["Let me ", "look again."], close_after=4))
            with trio.fail_after(15):
                retry = await sim2.run("req-2-retry", turn_2)
            assert retry.error is not None and retry.error["code"] == "unavailable", retry.end_stream

            # --- resume from the settled checkpoint ---------------------------------------------
            provider.enqueue(anthropic_text_script(["The file says alpha."]))
            before = len(provider.requests)
            with trio.fail_after(15):
                resumed = await sim2.run("req-resume", resume_request(settled, conversation_id=CONV))
            assert resumed.end_stream == {}, resumed.end_stream
            assert resumed.text() == "The file says alpha."
            assert resumed.execs == []  # a settled round is not run again
            assert len(provider.requests) == before + 1
            # The model continued turn 2's first branch: its round, once, and nothing of the retry.
            body = provider.requests[-1].json
            users = [m for m in body["messages"] if m["role"] == "user"]
            tool_results = [
                part
                for m in users
                for part in m["content"]
                if isinstance(part, dict) and part["type"] == "tool_result"
            ]
            assert [r["tool_use_id"] for r in tool_results] == ["toolu_1"]
            assert "look again" not in str(body) and "Let me" not in str(body)

            d2.proc.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                assert await d2.proc.wait() == 0
    await executor.aclose()
    with SQLiteStore.open_in(data_dir) as store:
        head = store.head(CONV)
        runs = {rid: store.run(rid) for rid in ("req-2", "req-2-retry", "req-resume")}
    # The head is the settled point's branch, continued by the answer.
    assert head.messages[: len(crashed.messages)] == crashed.messages
    assert shape(head.messages) == [*shape(crashed.messages), ("assistant", "")]
    assert {rid: r.status for rid, r in runs.items() if r is not None} == {
        "req-2": "error",
        "req-2-retry": "error",
        "req-resume": "success",
    }
