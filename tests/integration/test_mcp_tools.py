"""MCP end to end: the model (the fake provider) calls the MCP tools, the simulated Cursor
answers from the pretend MCP server it hosts (devtools/sim_mcp.py), the results come back over
BidiAppend and reach the next provider call. Every run here is replayed byte for byte when the
daemon stops (conftest.start_daemon)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from byok.devtools import sim_mcp
from byok.devtools.cursor_sim import CursorSim, Transcript, interaction_answer, user_turn
from byok.devtools.sim_mcp import SimMcp
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script, chat_tool_script

SERVER = sim_mcp.SERVER


@attrs.define
class Env:
    daemon: Daemon
    sim: CursorSim
    mcp: SimMcp


@pytest.fixture
async def env(daemon: Daemon, tmp_path: Path) -> AsyncIterator[Env]:
    root = tmp_path / "ws"
    root.mkdir()
    mcp = SimMcp()
    executor = WorkspaceExecutor(root, shell_timeout_cap_s=5.0, mcp=mcp)
    yield Env(daemon, CursorSim(daemon.base_url, daemon.client, executor=executor), mcp)
    await executor.aclose()


def turn(
    text: str, conv: str, *, announce: list[agent.McpToolDefinition] | None = None
) -> agent.AgentRunRequest:
    rr = user_turn(text, conversation_id=conv, model_id="byok-demo", message_id="m-" + text[:12])
    if announce is not None:
        rr.action.user_message_action.request_context.tools = announce
    return rr


def call(call_id: str, name: str, **args: Any) -> tuple[str, str, str]:
    return (call_id, name, json.dumps(args))


def completed(tr: Transcript) -> dict[str, agent.ToolCall]:
    updates = [f.message.interaction_update for f in tr.frames if f.message.interaction_update is not None]
    return {
        u.tool_call_completed.call_id: u.tool_call_completed.tool_call
        for u in updates
        if u.tool_call_completed
    }


def tool_results(d: Daemon, request: int = -1) -> dict[str, str]:
    """call id -> the tool message content the provider got in that request."""
    messages = d.provider.requests[request].json["messages"]
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def offered(d: Daemon, request: int = 0) -> list[str]:
    return [t["function"]["name"] for t in d.provider.requests[request].json["tools"]]


async def test_get_mcp_tools_then_call_mcp_tool_with_the_exact_definition(env: Env) -> None:
    d = env.daemon
    d.provider.enqueue(
        chat_tool_script([call("c1", "GetMcpTools", server=SERVER)]),
        chat_tool_script(
            [call("c2", "CallMcpTool", server=SERVER, toolName="add_note", arguments={"text": "milk"})]
        ),
        chat_text_script(["Noted."]),
    )
    tr = await env.sim.run("req-mcp-1", turn("note milk", "conv-mcp-1"))
    assert tr.end_stream == {}
    assert {"GetMcpTools", "CallMcpTool", "FetchMcpResource"} <= set(offered(d))
    # The state was asked for the named server only, and never only kicked.
    assert [(a.server_identifiers, a.kick_only) for a in env.mcp.state_requests] == [([SERVER], False)]
    listing = json.loads(tool_results(d, 1)["c1"])
    assert listing["server"] == SERVER and [t["tool"] for t in listing["tools"]] == [
        "add_note",
        "search_notes",
    ]
    assert listing["tools"][0]["inputSchema"]["required"] == ["text"]
    # The call carries name, provider_identifier and tool_name exactly as the state gave them.
    (sent,) = env.mcp.calls
    assert (sent.name, sent.provider_identifier, sent.tool_name, sent.tool_call_id) == (
        f"{SERVER}-add_note",
        sim_mcp.PROVIDER,
        "add_note",
        "c2",
    )
    assert {k: v.to_dict() for k, v in sent.args.items()} == {"text": "milk"}
    assert env.mcp.notes == ["milk"]
    assert (
        tool_results(d)["c2"] == 'Added note #1.\n\nStructured content:\n{\n  "count": 1,\n  "number": 1\n}'
    )
    cards = completed(tr)
    assert cards["c1"].get_mcp_tools_tool_call.result.success.content == tool_results(d, 1)["c1"]
    assert cards["c2"].mcp_tool_call.args.name == f"{SERVER}-add_note"
    assert cards["c2"].mcp_tool_call.result.success.content[0].text.text == "Added note #1."


async def test_call_mcp_tool_before_get_mcp_tools_sends_no_exec(env: Env) -> None:
    d = env.daemon
    d.provider.enqueue(
        chat_tool_script(
            [call("c1", "CallMcpTool", server=SERVER, toolName="add_note", arguments={"text": "x"})]
        ),
        chat_text_script(["I will look the tool up first."]),
    )
    tr = await env.sim.run("req-mcp-2", turn("note x", "conv-mcp-2"))
    assert tr.end_stream == {}
    assert tr.execs == [] and env.mcp.calls == []
    assert "call GetMcpTools" in tool_results(d)["c1"]
    assert completed(tr)["c1"].mcp_tool_call.result.error is not None


async def test_an_announced_mcp_tool_is_offered_and_called_under_its_own_name(env: Env) -> None:
    d = env.daemon
    name = f"{SERVER}-search_notes"
    d.provider.enqueue(
        chat_tool_script([call("c1", name, query="")]),
        chat_text_script(["The query was empty."]),
        chat_text_script(["Again."]),
    )
    announce = env.mcp.definitions()
    tr = await env.sim.run("req-mcp-3", turn("search", "conv-mcp-3", announce=announce))
    assert tr.end_stream == {}
    names = offered(d)
    assert names[-2:] == [f"{SERVER}-add_note", name]  # after byok's own, sorted
    spec = d.provider.requests[0].json["tools"][-1]["function"]
    assert spec["parameters"] == {
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "type": "object",
    }
    (sent,) = env.mcp.calls
    assert (sent.name, sent.provider_identifier, sent.tool_name) == (name, sim_mcp.PROVIDER, "search_notes")
    assert tool_results(d)["c1"] == f"The MCP tool {name} reported an error:\nquery must not be empty"
    assert completed(tr)["c1"].mcp_tool_call.result.success.is_error
    # The same announcement in the next turn: the same tool list, byte for byte (prompt caches).
    tr = await env.sim.run("req-mcp-3b", turn("again", "conv-mcp-3", announce=list(reversed(announce))))
    assert tr.end_stream == {}
    first, later = (json.dumps(r.json["tools"]) for r in (d.provider.requests[0], d.provider.requests[-1]))
    assert first == later


async def test_fetch_mcp_resource(env: Env) -> None:
    d = env.daemon
    d.provider.enqueue(
        chat_tool_script(
            [
                call("c1", "FetchMcpResource", server=SERVER, uri=sim_mcp.README),
                call("c2", "FetchMcpResource", server=SERVER, uri="notes://missing"),
            ]
        ),
        chat_text_script(["Read it."]),
    )
    tr = await env.sim.run("req-mcp-4", turn("readme", "conv-mcp-4"))
    assert tr.end_stream == {}
    results = tool_results(d)
    assert results["c1"] == sim_mcp.README_TEXT
    assert results["c2"] == f"The MCP resource notes://missing was not found on the server {SERVER!r}."
    assert [(r.server, r.uri) for r in env.mcp.reads] == [
        (SERVER, sim_mcp.README),
        (SERVER, "notes://missing"),
    ]
    card = completed(tr)["c1"].read_mcp_resource_tool_call
    assert card.args.uri == sim_mcp.README and card.result.success.text == sim_mcp.README_TEXT


async def test_mcp_errors_and_rejections(env: Env) -> None:
    d = env.daemon
    env.mcp.errors = {"add_note": "the notes file is locked"}
    env.mcp.rejected = frozenset({"search_notes"})
    d.provider.enqueue(
        chat_tool_script([call("c1", "GetMcpTools")]),
        chat_tool_script(
            [
                call("c2", "CallMcpTool", server=SERVER, toolName="add_note", arguments={"text": "x"}),
                call("c3", "CallMcpTool", server=SERVER, toolName="search_notes", arguments={"query": "x"}),
            ]
        ),
        chat_text_script(["Both failed."]),
    )
    tr = await env.sim.run("req-mcp-5", turn("try both", "conv-mcp-5"))
    assert tr.end_stream == {}
    assert env.mcp.state_requests[0].server_identifiers == []  # no server named: all of them
    results = tool_results(d)
    assert results["c2"] == f"The MCP tool {SERVER}/add_note failed: the notes file is locked"
    assert results["c3"] == f"The user rejected the MCP tool call {SERVER}/search_notes: the user said no"
    cards = completed(tr)
    assert cards["c2"].mcp_tool_call.result.error.error == "the notes file is locked"
    assert cards["c3"].mcp_tool_call.result.rejected.reason == "the user said no"


@pytest.mark.parametrize(
    ("state", "text"),
    [
        ("error", "Cursor could not report its MCP servers: the MCP process crashed"),
        ("rejected", "Listing the MCP tools was rejected: MCP is disabled"),
        ("throw", "the MCP state is not available"),
    ],
)
async def test_a_state_that_fails_leaves_the_table_empty(env: Env, state: str, text: str) -> None:
    d = env.daemon
    env.mcp.state = state
    d.provider.enqueue(
        chat_tool_script([call("c1", "GetMcpTools")]),
        chat_tool_script(
            [call("c2", "CallMcpTool", server=SERVER, toolName="add_note", arguments={"text": "x"})]
        ),
        chat_text_script(["No MCP."]),
    )
    tr = await env.sim.run(f"req-mcp-6-{state}", turn("try", f"conv-mcp-6-{state}"))
    assert tr.end_stream == {}
    assert tool_results(d, 1)["c1"] == text
    assert "call GetMcpTools" in tool_results(d)["c2"] and env.mcp.calls == []
    assert completed(tr)["c1"].get_mcp_tools_tool_call.result.error.error == text


async def test_mcp_auth_asks_the_user(env: Env) -> None:
    d = env.daemon
    queries: list[agent.InteractionQuery] = []

    def approve(query: agent.InteractionQuery) -> list[agent.AgentClientMessage]:
        queries.append(query)
        answer = agent.McpAuthRequestResponse(approved=agent.McpAuthRequestResponseApproved())
        return [interaction_answer(query, mcp_auth_request_response=answer)]

    env.sim.on_query = approve
    d.provider.enqueue(
        chat_tool_script([call("c1", "CallMcpTool", server=SERVER, toolName="mcp_auth")]),
        chat_text_script(["Signed in."]),
    )
    tr = await env.sim.run("req-mcp-7", turn("sign in", "conv-mcp-7"))
    assert tr.end_stream == {}
    (query,) = queries
    assert query.mcp_auth_request_query.args == agent.McpAuthArgs(server_identifier=SERVER, tool_call_id="c1")
    assert tr.execs == []
    assert tool_results(d)["c1"].startswith(f"The MCP server {SERVER!r} is authenticated.")
    assert completed(tr)["c1"].mcp_auth_tool_call.result.success.server_identifier == SERVER
