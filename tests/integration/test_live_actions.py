"""Conversation actions Cursor sends into a live run: background_shell_action moves the running
Shell to the background; a user_message_action stops the run with an error that says to send
the message again (byok takes one message per request). And the shell actions as run requests:
background_shell_action handed to the live run, shell_command_action a turn of its own."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from byok.cursor.user_shell import ShellOutput
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


# --- the same actions as run requests of their own ----------------------------------------------


def action_request(conv: str, **kw: object) -> agent.AgentRunRequest:
    return agent.AgentRunRequest(
        conversation_state=agent.ConversationStateStructure(),
        action=agent.ConversationAction(**kw),  # type: ignore[arg-type]
        requested_model=agent.RequestedModel(model_id="byok-demo"),
        conversation_id=conv,
    )


async def test_background_shell_action_as_a_run_request_goes_to_the_live_run(env: Env) -> None:
    command = json.dumps({"command": "echo started; sleep 20", "block_until_ms": 20000})
    env.daemon.provider.enqueue(chat_tool_script([("call_s", "Shell", command)]), chat_text_script(["ok"]))
    request = user_turn("serve", conversation_id="conv-bg-req", model_id="byok-demo", message_id="m-1")
    shell_running = trio.Event()
    outcome: dict[str, Transcript] = {}

    def on_frame(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
        if rec.kind == "interaction_update.tool_call_delta":
            shell_running.set()
        return []

    async def move_it() -> None:
        await shell_running.wait()
        other = CursorSim(env.daemon.base_url, env.daemon.client)
        bg = agent.BackgroundShellAction(tool_call_id="call_s")
        outcome["bg"] = await other.run(
            "req-bg-req-2", action_request("conv-bg-req", background_shell_action=bg)
        )

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(move_it)
            tr = await env.sim.run("req-bg-req-1", request, on_frame=on_frame)
    assert outcome["bg"].end_stream == {} and outcome["bg"].frames == []
    assert tr.end_stream == {}  # the live run was not superseded: its shell moved to the background
    assert [e.kind for e in tr.execs] == ["shell_stream_args", "force_background_shell_args"]
    # With no live run there is nothing to move: a clear error, no run.
    bg = agent.BackgroundShellAction(tool_call_id="call_s")
    message = agent.AgentClientMessage(run_request=action_request("conv-bg-req", background_shell_action=bg))
    refused = await env.sim.append("req-bg-req-3", 0, message)
    assert refused.status_code == 400
    assert refused.json()["code"] == "failed_precondition" and "not running" in refused.json()["message"]


async def test_a_shell_command_the_user_runs_is_a_turn_of_its_own(env: Env) -> None:
    env.daemon.provider.enqueue(chat_text_script(["hi"]))
    first = await env.sim.run(
        "req-sh-1", user_turn("hello", conversation_id="conv-sh", model_id="byok-demo", message_id="m-1")
    )
    state = first.checkpoints()[-1]
    command = agent.ShellCommand(command="echo hello; echo oops >&2; exit 2")
    shell = action_request(
        "conv-sh", shell_command_action=agent.ShellCommandAction(shell_command=command, exec_id="x-1")
    )
    shell.conversation_state = state
    tr = await env.sim.run("req-sh-2", shell)
    assert tr.end_stream == {}
    assert [(e.kind, e.exec_id) for e in tr.execs] == [("shell_stream_args", "x-1")]
    kinds = tr.kinds()
    assert "interaction_update.shell_output_delta" in kinds
    assert not any(k.startswith("interaction_update.tool_call") or "partial_tool_call" in k for k in kinds)
    assert len(env.daemon.provider.requests) == 1  # no model was called
    checkpoints = tr.checkpoints()
    assert len(checkpoints) == 3 and checkpoints[0] == checkpoints[1] == checkpoints[2]
    final = checkpoints[-1]
    assert list(final.turns[:-1]) == list(state.turns)
    turn = agent.ConversationTurnStructure.parse(env.sim.blobs[final.turns[-1]]).shell_conversation_turn
    assert agent.ShellCommand.parse(env.sim.blobs[turn.shell_command]).command == command.command
    assert env.sim.blobs[turn.shell_output] == ShellOutput("hello\n", "oops\n", 2).encode()
    # The next turn's model reads what the user ran; the shell turn stays among the turns.
    env.daemon.provider.enqueue(chat_text_script(["I saw it"]))
    nxt = user_turn(
        "what happened?", conversation_id="conv-sh", model_id="byok-demo", message_id="m-3", state=final
    )
    tr3 = await env.sim.run("req-sh-3", nxt)
    assert tr3.end_stream == {}
    sent = [m["content"] for m in env.daemon.provider.requests[1].json["messages"] if m["role"] == "user"]
    assert any("$ echo hello" in c and "hello" in c and "Exit code: 2" in c for c in sent)
    assert list(tr3.checkpoints()[-1].turns[: len(final.turns)]) == list(final.turns)
