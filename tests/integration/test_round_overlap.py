"""The next provider call overlaps the client's ACKs of a tool round's settled checkpoint.

The settled checkpoint waits for the client to answer its blob SETs, one append each. The next
request goes to the provider meanwhile; what the provider answers reaches the client only after
the checkpoint (it precedes the next model interaction). A failed call still publishes the
checkpoint of the committed results; a failed publish ends the run without the call's output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from byok.devtools.cursor_sim import CursorSim, Recorded, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script, chat_tool_script, error_script
from tests.support.run_driver import cancel_message

SLOW_ACK_S = 0.2
OUTPUT = ("interaction_update.text_delta", "interaction_update.partial_tool_call")


@pytest.fixture
async def sim(daemon: Daemon, tmp_path: Path) -> AsyncIterator[CursorSim]:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\nbeta\n")
    executor = WorkspaceExecutor(root)
    sim = CursorSim(daemon.base_url, daemon.client, executor=executor)
    yield sim
    await executor.aclose()


def _execs_run(sim: CursorSim) -> list[agent.ExecServerMessage]:
    """The Execs the sim's executor has started, as it starts them."""
    ran: list[agent.ExecServerMessage] = []
    executor = sim.executor
    assert executor is not None
    original = executor.run

    async def run(msg, reply, *, delay=0.0):  # type: ignore[no-untyped-def]
        ran.append(msg)
        await original(msg, reply, delay=delay)

    executor.run = run  # type: ignore[method-assign]
    return ran


def _slow_after_the_result(sim: CursorSim) -> None:
    """Answer every KV request at once until the round's Read has run, then each SLOW_ACK_S late."""
    ran = _execs_run(sim)
    sim.kv_delay = lambda _kv: SLOW_ACK_S if ran else 0.0


def _round(daemon: Daemon, *then: object) -> None:
    daemon.provider.enqueue(chat_tool_script([("call_1", "Read", '{"path": "notes.txt"}')]), *then)  # type: ignore[arg-type]


async def _run(sim: CursorSim, rid: str) -> Transcript:
    return await sim.run(
        rid, user_turn("read", conversation_id=f"c-{rid}", model_id="byok-demo", message_id=rid)
    )


def _settled(tr: Transcript) -> int:
    kinds = tr.kinds(skip=())
    done = kinds.index("interaction_update.tool_call_completed")
    return next(i for i in range(done, len(kinds)) if kinds[i] == "conversation_checkpoint")


async def test_the_next_request_goes_out_while_the_client_answers_the_settled_sets(
    daemon: Daemon, sim: CursorSim
) -> None:
    _slow_after_the_result(sim)
    _round(daemon, chat_text_script(["two lines"]))
    tr = await _run(sim, "overlap")
    assert tr.end_stream == {} and tr.text() == "two lines"
    settled = _settled(tr)
    second = daemon.provider.requests[1]
    # The request reached the provider before the client had the settled checkpoint: at
    # least one slow ACK earlier (sequential, it came after every ACK of the checkpoint).
    assert second.at < tr.frames[settled].at - SLOW_ACK_S / 2
    # Its answer did not: the first output of the second call follows the checkpoint.
    kinds = tr.kinds(skip=())
    first_output = next(i for i in range(settled, len(kinds)) if kinds[i] in OUTPUT)
    assert first_output > settled
    assert not any(
        k in OUTPUT for k in kinds[kinds.index("interaction_update.tool_call_completed") : settled]
    )


async def test_a_call_that_fails_meanwhile_still_publishes_the_settled_checkpoint(
    daemon: Daemon, sim: CursorSim
) -> None:
    _slow_after_the_result(sim)
    _round(daemon, error_script(400, "bad request"))
    tr = await _run(sim, "fails")
    assert tr.error is not None and tr.error["code"] == "unavailable"
    settled = tr.checkpoints()[_settled_index(tr)]
    assert settled.pending_tool_calls == []
    with SQLiteStore.open_in(daemon.data_dir) as store:
        roles = [m.role for m in store.head("c-fails").messages]
    assert roles == ["user", "assistant", "tool"]


def _settled_index(tr: Transcript) -> int:
    """The settled checkpoint's place among the transcript's checkpoints."""
    kinds = tr.kinds(skip=())
    return [i for i, k in enumerate(kinds) if k == "conversation_checkpoint"].index(_settled(tr))


async def test_a_publish_that_fails_ends_the_run_without_the_calls_output(
    daemon: Daemon, sim: CursorSim
) -> None:
    ran = _execs_run(sim)

    def refuse_after_the_result(kv: agent.KvServerMessage) -> agent.KvClientMessage | None:
        if ran and kv.set_blob_args is not None:
            error = agent.Error(message="injected: store full")
            return agent.KvClientMessage(id=kv.id, set_blob_result=agent.SetBlobResult(error=error))
        return sim_answer(kv)

    def sim_answer(kv: agent.KvServerMessage) -> agent.KvClientMessage | None:
        sim.kv_reply = None
        try:
            out = sim.auto_reply(agent.AgentServerMessage(kv_server_message=kv))
        finally:
            sim.kv_reply = refuse_after_the_result
        return out[0].kv_client_message if out else None

    sim.kv_reply = refuse_after_the_result
    _round(daemon, chat_text_script(["never shown"]))
    tr = await _run(sim, "refused")
    assert tr.error is not None
    assert tr.error["code"] == "internal" and "checkpoint not published" in tr.error["message"]
    assert "never shown" not in tr.text()
    kinds = tr.kinds(skip=())
    done = kinds.index("interaction_update.tool_call_completed")
    assert not any(k in OUTPUT for k in kinds[done:])


async def test_a_cancel_while_the_checkpoint_waits_ends_the_run_canceled(
    daemon: Daemon, sim: CursorSim
) -> None:
    _slow_after_the_result(sim)
    cancelled: list[bool] = []

    def cancel_at_the_first_slow_set(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
        # The SET of the result's root, answered SLOW_ACK_S late: the daemon had the result
        # when it sent it, so the round is complete by now, and the checkpoint still waits for
        # the ACKs after this one.
        kv = rec.message.kv_server_message
        result_root = (
            kv is not None and kv.set_blob_args is not None and b'"tool-result"' in kv.set_blob_args.blob_data
        )
        if result_root and not cancelled:
            cancelled.append(True)
            return [cancel_message()]
        return []

    _round(daemon, chat_text_script(["never shown"], delay_s=0.05))
    tr = await sim.run(
        "cancel",
        user_turn("read", conversation_id="c-cancel", model_id="byok-demo", message_id="cancel"),
        on_frame=cancel_at_the_first_slow_set,
    )
    assert cancelled
    assert tr.error is not None and tr.error["code"] == "canceled", tr.end_stream
    assert "never shown" not in tr.text()
    # It came while the next call was out and the settled checkpoint still waited for ACKs:
    # neither the call's output nor that checkpoint reached the client.
    assert len(daemon.provider.requests) == 2
    assert [c.pending_tool_calls != [] for c in tr.checkpoints()] == [True]
