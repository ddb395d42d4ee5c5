"""Subagents end to end: the parent's Task becomes a subagent_args Exec, the simulated Cursor
runs the child as a run of its own (devtools/sim_subagent.py) with the x-parent headers, the
child writes a file and reports progress, and its report comes back as the Task's result; a
background child's completion reaches the parent conversation once, however often it is sent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from byok.devtools import sim_mcp
from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
from byok.devtools.sim_mcp import SimMcp
from byok.devtools.sim_subagent import SubagentHost
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script, chat_tool_script
from tests.support.run_driver import background_request


@attrs.define
class Env:
    daemon: Daemon
    sim: CursorSim
    host: SubagentHost
    root: Path
    mcp: SimMcp


@pytest.fixture
async def env(daemon: Daemon, tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Env]:
    root = tmp_path / "ws"
    root.mkdir()
    mcp = SimMcp()
    executor = WorkspaceExecutor(root, shell_timeout_cap_s=5.0, mcp=mcp)
    sim = CursorSim(daemon.base_url, daemon.client, executor=executor)
    yield Env(daemon, sim, SubagentHost(sim, nursery).install(), root, mcp)
    await executor.aclose()


def call(call_id: str, name: str, **args: Any) -> tuple[str, str, str]:
    return (call_id, name, json.dumps(args))


def completed(tr: Transcript) -> dict[str, agent.ToolCall]:
    updates = [f.message.interaction_update for f in tr.frames if f.message.interaction_update is not None]
    return {
        u.tool_call_completed.call_id: u.tool_call_completed.tool_call
        for u in updates
        if u.tool_call_completed
    }


def tools_of(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.json.get("tools", [])]


def tool_results(request: Any) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request.json["messages"] if m["role"] == "tool"}


def parent_turn(text: str, conv: str, **extra: Any) -> agent.AgentRunRequest:
    rr = user_turn(text, conversation_id=conv, model_id="byok-demo", message_id="m-" + text[:10])
    for key, value in extra.items():
        setattr(rr, key, value)
    return rr


async def test_a_foreground_subagent_writes_a_file_reports_progress_and_answers_the_task(env: Env) -> None:
    provider = env.daemon.provider
    provider.enqueue(
        chat_tool_script(
            [call("t1", "Task", description="Write notes", prompt="Write notes.txt saying hello.")]
        ),
        # The child: the user's MCP server, a file and a progress report, then its summary and answer.
        chat_tool_script([call("g1", "GetMcpTools", server=sim_mcp.SERVER)]),
        chat_tool_script(
            [
                call(
                    "m1",
                    "CallMcpTool",
                    server=sim_mcp.SERVER,
                    toolName="add_note",
                    arguments={"text": "hello"},
                ),
                call("w1", "Write", path="notes.txt", contents="hello\n"),
                call("u1", "UpdateCurrentStep", current_step="Writing notes"),
            ]
        ),
        chat_tool_script(
            [call("u2", "UpdateCurrentStep", final_summary="Wrote notes.txt", completed_subtitle="1 file")]
        ),
        chat_text_script(["Wrote notes.txt."]),
        # The parent again, with the Task's result.
        chat_text_script(["The subagent wrote it."]),
    )
    tr = await env.sim.run("p-req", parent_turn("delegate the notes", "conv-p"))
    assert tr.end_stream == {}
    assert tr.text() == "The subagent wrote it."
    assert (env.root / "notes.txt").read_text() == "hello\n"

    (task_exec,) = [
        f.message.exec_server_message for f in tr.frames if f.kind == "exec_server_message.subagent_args"
    ]
    args = task_exec.subagent_args
    assert (args.tool_call_id, args.subagent_type, args.model_id, args.prompt) == (
        "t1",
        "generalPurpose",
        "byok-demo",  # inherits the parent's model
        "Write notes.txt saying hello.",
    )
    assert args.parent_conversation_id == args.root_parent_conversation_id == "conv-p"
    assert not args.run_in_background

    parent_first, child_first, _, _, _, parent_second = provider.requests[-6:]
    assert tool_results(parent_second) == {
        "t1": "Subagent name: Write notes\nSubagent ID: agent-t1\n\nWrote notes.txt."
    }
    card = completed(tr)["t1"].task_tool_call
    assert card.args.description == "Write notes" and card.args.subagent_type.unspecified is not None
    assert card.result.success.agent_id == "agent-t1" and not card.result.success.is_background
    # The child runs the subagent set: it can write and report progress, it cannot ask the user.
    assert "Task" in tools_of(parent_first) and "UpdateCurrentStep" not in tools_of(parent_first)
    child_tools = tools_of(child_first)
    assert {"Write", "UpdateCurrentStep", "Task"} <= set(child_tools) and "AskQuestion" not in child_tools

    child = env.host.children[0]
    assert child.transcript is not None and child.transcript.end_stream == {}
    progress = child.transcript.checkpoints()[-1].communicate_update_states_by_parent_tool_call_id["t1"]
    # UpdateCurrentStep is the turn's fourth step: GetMcpTools, CallMcpTool, Write, then it.
    assert [(h.step, h.message_index) for h in progress.history] == [("Writing notes", 4)]
    assert (progress.final_summary, progress.completed_subtitle) == ("Wrote notes.txt", "1 file")
    update = completed(child.transcript)["u1"].communicate_update_tool_call
    assert update.result.success.current_step == "Writing notes" and update.result.success.message_index == 4
    # The subagent used the user's MCP server (seeds 000 §32: subagents have the MCP tools).
    assert env.mcp.notes == ["hello"]
    assert [c.tool_name for c in env.mcp.calls] == ["add_note"]


async def test_a_background_subagent_completion_is_appended_once(env: Env) -> None:
    provider = env.daemon.provider
    env.host.release = trio.Event()  # the child starts after the parent's turn
    provider.enqueue(
        chat_tool_script(
            [call("t1", "Task", description="Survey", prompt="List the files.", run_in_background=True)]
        ),
        chat_text_script(["Started a survey."]),
    )
    tr = await env.sim.run("bg-req", parent_turn("survey in the background", "conv-b"))
    assert tr.end_stream == {}
    result = tool_results(provider.requests[-1])["t1"]
    assert result.startswith("Subagent name: Survey\nSubagent ID: agent-t1")
    assert completed(tr)["t1"].task_tool_call.result.success.is_background
    state = tr.checkpoints()[-1]

    provider.enqueue(chat_text_script(["Found 2 files."]))
    env.host.release.set()
    with trio.fail_after(10):
        while not env.host.finished:
            await trio.sleep(0.01)
    (completion,) = env.host.finished
    provider.enqueue(chat_text_script(["The survey found 2 files."]))
    first = await env.sim.run("bg-done-1", background_request([completion], conversation_id="conv-b"))
    assert first.end_stream == {} and first.text() == "The survey found 2 files."
    calls = len(provider.requests)
    # The client sends the same completion again: no second report, no second answer.
    again = await env.sim.run("bg-done-2", background_request([completion], conversation_id="conv-b"))
    assert again.end_stream == {} and again.text() == ""
    assert len(provider.requests) == calls
    with SQLiteStore.open_in(env.daemon.data_dir) as store:
        messages = store.head("conv-b").messages
    assert [m.event_id for m in messages].count("subagent-completed:agent-t1") == 1
    assert [m.role for m in messages[-2:]] == ["user", "assistant"]
    assert state.turns  # the parent's transcript went on


async def test_a_disabled_subagent_type_is_refused_without_an_exec(env: Env) -> None:
    provider = env.daemon.provider
    provider.enqueue(
        chat_tool_script([call("t1", "Task", description="Look", prompt="Look around.")]),
        chat_text_script(["No subagents then."]),
    )
    override = agent.SubagentModelOverride(subagent_type="generalPurpose", disabled=True)
    tr = await env.sim.run("d-req", parent_turn("delegate", "conv-d", subagent_model_overrides=[override]))
    assert tr.end_stream == {}
    assert not [f for f in tr.frames if f.kind == "exec_server_message.subagent_args"]
    assert "disabled" in tool_results(provider.requests[-1])["t1"]
    assert completed(tr)["t1"].task_tool_call.result.error.error


async def test_a_model_override_picks_the_subagents_model(env: Env) -> None:
    provider = env.daemon.provider
    override = agent.SubagentModelOverride(
        subagent_type="explore", model=agent.RequestedModel(model_id="byok-demo")
    )
    provider.enqueue(
        chat_tool_script(
            [
                call(
                    "t1",
                    "Task",
                    description="Find",
                    prompt="Find it.",
                    subagent_type="explore",
                    model="other",
                )
            ]
        ),
        chat_text_script(["found"]),
        chat_text_script(["ok"]),
    )
    tr = await env.sim.run("o-req", parent_turn("find", "conv-o", subagent_model_overrides=[override]))
    assert tr.end_stream == {}
    (args,) = [
        f.message.exec_server_message.subagent_args for f in tr.frames if f.kind.endswith("subagent_args")
    ]
    assert (args.subagent_type, args.model_id) == ("explore", "byok-demo")
    assert completed(tr)["t1"].task_tool_call.args.subagent_type.explore is not None


async def test_a_run_keeps_the_parent_its_first_append_named(env: Env) -> None:
    first = {"x-parent-request-id": "p1", "x-parent-agent-tool-call-id": "t1"}
    msg = agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())
    assert (await env.sim.append("child-1", 1, msg, first)).status_code == 200
    other = {**first, "x-parent-agent-tool-call-id": "t2"}
    resp = await env.sim.append("child-1", 2, msg, other)
    assert resp.status_code == 400 and "bound to parent" in resp.text


async def test_cancel_subagent_action_cancels_the_childs_run(env: Env) -> None:
    provider = env.daemon.provider
    provider.enqueue(chat_text_script(["hello"]))
    tr = await env.sim.run("c-req", parent_turn("hi", "conv-c"))
    # The child's run hangs in its provider call until it is cancelled.
    provider.enqueue(chat_text_script(["never"], delay_s=30))
    child_run: list[Transcript] = []

    async def child() -> None:
        request = parent_turn("work", "agent-x")
        child_run.append(await env.sim.run("x-req", request))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)
        await trio.sleep(0.3)
        cancel = agent.AgentRunRequest(
            conversation_state=tr.checkpoints()[-1],
            action=agent.ConversationAction(
                cancel_subagent_action=agent.CancelSubagentAction(subagent_id="agent-x")
            ),
            requested_model=agent.RequestedModel(model_id="byok-demo"),
            conversation_id="conv-c",
        )
        with trio.fail_after(10):
            answer = await env.sim.run("c-cancel", cancel)
    assert answer.end_stream == {}
    assert child_run[0].end_stream is not None and child_run[0].end_stream["error"]["code"] == "canceled"
