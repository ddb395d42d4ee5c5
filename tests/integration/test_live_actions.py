"""Conversation actions Cursor sends into a live run: background_shell_action moves the running
Shell to the background; a user_message_action stops the run with an error that says to send
the message again (byok takes one message per request)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, Recorded, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script, chat_tool_script


@attrs.define
class Env:
    daemon: Daemon
    sim: CursorSim
    executor: WorkspaceExecutor


@pytest.fixture
async def env(daemon: Daemon, tmp_path: Path) -> AsyncIterator[Env]:
    root = tmp_path / "ws"
    root.mkdir()
    executor = WorkspaceExecutor(root, shell_timeout_cap_s=30.0, terminals_folder=tmp_path / "terminals")
    yield Env(daemon, CursorSim(daemon.base_url, daemon.client, executor=executor), executor)
    await executor.aclose()


def action(**kw: object) -> agent.AgentClientMessage:
    return agent.AgentClientMessage(conversation_action=agent.ConversationAction(**kw))  # type: ignore[arg-type]


def once(when: str, message: agent.AgentClientMessage):
    """on_frame: send ``message`` after the first frame of kind ``when``."""
    sent = False

    def on_frame(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
        nonlocal sent
        if sent or rec.kind != when:
            return []
        sent = True
        return [message]

    return on_frame


async def test_background_shell_action_moves_the_running_shell_to_the_background(env: Env) -> None:
    command = json.dumps({"command": "echo started; sleep 20; echo never", "block_until_ms": 20000})
    env.daemon.provider.enqueue(chat_tool_script([("call_s", "Shell", command)]), chat_text_script(["ok"]))
    request = user_turn("serve", conversation_id="conv-bg", model_id="byok-demo", message_id="m-bg")
    move = action(background_shell_action=agent.BackgroundShellAction(tool_call_id="call_s"))
    started = time.monotonic()
    with trio.fail_after(15):
        tr = await env.sim.run("req-bg", request, on_frame=once("interaction_update.tool_call_delta", move))
    assert time.monotonic() - started < 10  # not the 20 s the command would block for
    assert tr.end_stream == {}
    assert [e.kind for e in tr.execs] == ["shell_stream_args", "force_background_shell_args"]
    control = tr.execs[1]
    assert control.exec_id == "call_s" and control.id != tr.execs[0].id
    card = next(
        f.message.interaction_update.tool_call_completed.tool_call.shell_tool_call
        for f in tr.frames
        if f.kind == "interaction_update.tool_call_completed"
    )
    assert card.result.is_background and card.result.success.shell_id
    assert card.result.success.background_reason == agent.ShellBackgroundReason.USER_REQUEST
    result = env.daemon.provider.requests[1].json["messages"][-1]["content"]
    assert "still running in the background" in result and "started" in result
    (shell,) = env.executor.background.values()
    assert shell.process.returncode is None


async def test_background_shell_action_for_no_running_shell_changes_nothing(env: Env) -> None:
    env.daemon.provider.enqueue(chat_text_script(["hello"], delay_s=0.2))
    request = user_turn("hi", conversation_id="conv-bg-none", model_id="byok-demo", message_id="m-bgn")
    move = action(background_shell_action=agent.BackgroundShellAction(tool_call_id="call_gone"))
    tr = await env.sim.run("req-bg-none", request, on_frame=once("interaction_update.text_delta", move))
    assert tr.end_stream == {} and tr.text() == "hello" and tr.execs == []


async def test_a_user_message_during_the_run_stops_it_with_an_error_naming_it(env: Env) -> None:
    command = json.dumps({"command": "sleep 20", "block_until_ms": 20000})
    env.daemon.provider.enqueue(chat_tool_script([("call_s", "Shell", command)]))
    request = user_turn("wait", conversation_id="conv-msg", model_id="byok-demo", message_id="m-1")
    interrupt = action(
        user_message_action=agent.UserMessageAction(
            user_message=agent.UserMessage(text="actually, stop and list the files", message_id="m-2")
        )
    )
    started = time.monotonic()
    with trio.fail_after(15):
        tr = await env.sim.run(
            "req-msg", request, on_frame=once("exec_server_message.shell_stream_args", interrupt)
        )
    assert time.monotonic() - started < 10
    error = tr.error
    assert error is not None and error["code"] == "failed_precondition"
    assert "actually, stop and list the files" in error["message"] and "send it again" in error["message"]
    assert tr.execs[0].aborted  # the running Exec is told to stop
    assert len(env.daemon.provider.requests) == 1  # the message reached no model
    store = SQLiteStore(env.daemon.data_dir / "byok.db")
    try:
        texts = [m.text for m in store.head("conv-msg").messages]
    finally:
        store.close()
    assert not any("list the files" in t for t in texts)
