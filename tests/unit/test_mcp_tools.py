"""The MCP tools through the real router and dispatch (sans-IO): what each sends, the run's
definition table, and the announced MCP tools offered under their own names."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from byok.cursor.exec_router import ExecRouter, dispatch
from byok.cursor.request import RunStart
from byok.cursor.tools.base import ToolOutcome
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.mcp_dynamic import MAX_NAME, DynamicTools, announced, dynamic_tools, run_tools
from byok.cursor.tools.mcp_results import json_value
from byok.cursor.tools.registry import build_registry
from byok.model.messages import ToolCall
from byok.model.request import ToolSpec
from byok.pb.agent import v1 as agent

REGISTRY = build_registry()
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}
# As a real client gives it (seeds 000 §33.3): none of these is derived from another.
ADD = agent.McpToolDefinition(
    name="user-notes-add",
    provider_identifier="notes",
    tool_name="add",
    description="Add a note.",
    input_schema=json_value(SCHEMA),
)
STATE = agent.McpStateSuccess(
    servers=[agent.McpStateServer(server_name="notes", server_identifier="user-notes", tools=[ADD])]
)


class Round:
    def __init__(self, registry: dict | None = None) -> None:
        self.frames: list[agent.AgentServerMessage] = []
        self.done: dict[str, ToolOutcome] = {}
        self.env = ToolEnv(request_id="req")
        self.registry = registry or REGISTRY
        self.router = ExecRouter(self._send, "req", lambda cid, o: self.done.__setitem__(cid, o))

    def _send(self, data: bytes) -> None:
        self.frames.append(agent.AgentServerMessage().parse(data))

    def call(self, call_id: str, name: str, args: dict[str, Any]) -> None:
        calls = (ToolCall(call_id, name, json.dumps(args), 0),)
        dispatch(self.router, self.registry, self._send, "mc", calls, {}, self.env)

    def execs(self) -> list[agent.ExecServerMessage]:
        return [f.exec_server_message for f in self.frames if f.exec_server_message is not None]

    def answer(self, **result: Any) -> None:
        last = self.execs()[-1]
        self.router.on_exec_message(agent.ExecClientMessage(id=last.id, exec_id=last.exec_id, **result))


def test_get_mcp_tools_asks_for_the_state_and_fills_the_table_from_a_success() -> None:
    r = Round()
    r.call("c1", "GetMcpTools", {})
    (state,) = r.execs()
    assert state.mcp_state_exec_args.server_identifiers == [] and not state.mcp_state_exec_args.kick_only
    assert state.exec_id == "c1"
    r.answer(mcp_state_exec_result=agent.McpStateExecResult(success=STATE))
    out = r.done["c1"]
    assert not out.is_error and json.loads(out.content)["servers"][0]["server"] == "user-notes"
    assert out.ui.get_mcp_tools_tool_call.result.success.content == out.content
    assert r.env.mcp == {("user-notes", "add"): ADD}
    # A named server is asked for by its identifier.
    r.call("c2", "GetMcpTools", {"server": "user-notes", "toolName": "add"})
    assert r.execs()[-1].mcp_state_exec_args.server_identifiers == ["user-notes"]


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (agent.McpStateExecResult(error=agent.McpStateError(error="no state")), "Cursor could not report"),
        (
            agent.McpStateExecResult(rejected=agent.McpStateRejected(reason="no")),
            "Listing the MCP tools was rejected",
        ),
    ],
)
def test_get_mcp_tools_failures_fill_nothing(result: agent.McpStateExecResult, text: str) -> None:
    r = Round()
    r.call("c1", "GetMcpTools", {})
    r.answer(mcp_state_exec_result=result)
    out = r.done["c1"]
    assert out.is_error and out.content.startswith(text)
    assert out.ui.get_mcp_tools_tool_call.result.error is not None
    assert r.env.mcp == {}


def test_get_mcp_tools_argument_rules() -> None:
    r = Round()
    r.call("c1", "GetMcpTools", {"toolName": "add"})
    r.call("c2", "GetMcpTools", {"pattern": "x" * 257})
    assert r.execs() == []
    assert "toolName requires server" in r.done["c1"].content
    assert "256 characters" in r.done["c2"].content


def test_call_mcp_tool_before_get_mcp_tools_is_an_error_with_no_exec() -> None:
    r = Round()
    r.call("c1", "CallMcpTool", {"server": "user-notes", "toolName": "add", "arguments": {"text": "hi"}})
    assert r.execs() == []
    out = r.done["c1"]
    assert out.is_error and "call GetMcpTools" in out.content and "was not called" in out.content
    started = [f for f in r.frames if f.interaction_update is not None]
    assert started and started[0].interaction_update.tool_call_started.tool_call.mcp_tool_call is not None


def test_call_mcp_tool_sends_the_definition_exactly_as_the_state_gave_it() -> None:
    r = Round()
    r.env.mcp[("user-notes", "add")] = ADD
    r.call(
        "c1", "CallMcpTool", {"server": "user-notes", "toolName": "add", "arguments": {"text": "hi", "n": 2}}
    )
    (sent,) = r.execs()
    args = sent.mcp_args
    assert (args.name, args.provider_identifier, args.tool_name, args.tool_call_id) == (
        "user-notes-add",
        "notes",
        "add",
        "c1",
    )
    assert args.args == {"text": json_value("hi"), "n": json_value(2)}
    success = agent.McpSuccess(
        content=[agent.McpToolResultContentItem(text=agent.McpTextContent(text="added"))]
    )
    r.answer(mcp_result=agent.McpResult(success=success))
    out = r.done["c1"]
    assert (out.content, out.is_error) == ("added", False)
    assert out.ui.mcp_tool_call.args == args


def test_arguments_as_a_json_string_and_bad_arguments() -> None:
    r = Round()
    r.env.mcp[("user-notes", "add")] = ADD
    r.call("c1", "CallMcpTool", {"server": "user-notes", "toolName": "add", "arguments": '{"text": "x"}'})
    assert r.execs()[-1].mcp_args.args == {"text": json_value("x")}
    r.call("c2", "CallMcpTool", {"server": "user-notes", "toolName": "add", "arguments": [1]})
    r.call("c3", "CallMcpTool", {"toolName": "add"})
    assert "must be an object" in r.done["c2"].content
    assert "missing required argument 'server'" in r.done["c3"].content
    assert len(r.execs()) == 1


@pytest.mark.parametrize("approved", [True, False])
def test_mcp_auth_is_an_interaction_query(approved: bool) -> None:
    r = Round()
    r.call("c1", "CallMcpTool", {"server": "user-web", "toolName": "mcp_auth"})
    assert r.execs() == []
    started = next(f for f in r.frames if f.interaction_update is not None).interaction_update
    assert started.tool_call_started.tool_call.mcp_auth_tool_call.args.server_identifier == "user-web"
    query = next(f.interaction_query for f in r.frames if f.interaction_query is not None)
    assert query.mcp_auth_request_query.args == agent.McpAuthArgs(
        server_identifier="user-web", tool_call_id="c1"
    )
    response = (
        agent.McpAuthRequestResponse(approved=agent.McpAuthRequestResponseApproved())
        if approved
        else agent.McpAuthRequestResponse(rejected=agent.McpAuthRequestResponseRejected(reason="later"))
    )
    r.router.on_interaction(agent.InteractionResponse(id=query.id, mcp_auth_request_response=response))
    out = r.done["c1"]
    card = out.ui.mcp_auth_tool_call.result
    if approved:
        assert not out.is_error and card.success.server_identifier == "user-web"
    else:
        assert out.is_error and out.content.endswith(": later") and card.rejected.reason == "later"


def test_fetch_mcp_resource() -> None:
    r = Round()
    r.call("c1", "FetchMcpResource", {"server": "user-notes", "uri": "notes://readme", "downloadPath": ""})
    (sent,) = r.execs()
    assert sent.read_mcp_resource_exec_args == agent.ReadMcpResourceExecArgs(
        server="user-notes", uri="notes://readme"
    )
    success = agent.ReadMcpResourceSuccess(uri="notes://readme", text="hello")
    r.answer(read_mcp_resource_exec_result=agent.ReadMcpResourceExecResult(success=success))
    assert r.done["c1"].content == "hello"


def test_a_throw_and_a_wrong_variant_end_the_call_with_an_error() -> None:
    r = Round()
    r.env.mcp[("user-notes", "add")] = ADD
    r.call("c1", "CallMcpTool", {"server": "user-notes", "toolName": "add"})
    r.router.on_control(
        agent.ExecClientControlMessage(throw=agent.ExecClientThrow(id=1, error="server crashed"))
    )
    assert r.done["c1"].is_error and r.done["c1"].content == "server crashed"
    r.call("c2", "FetchMcpResource", {"server": "s", "uri": "u"})
    r.answer(mcp_result=agent.McpResult())
    assert "expected read_mcp_resource_exec_result" in r.done["c2"].content


# --- announced (dynamic) MCP tools ------------------------------------------------------------------


def announce(name: str, tool: str = "t", provider: str = "p", schema: Any = None) -> agent.McpToolDefinition:
    return agent.McpToolDefinition(
        name=name,
        provider_identifier=provider,
        tool_name=tool,
        input_schema=json_value(schema) if schema is not None else None,
    )


def test_dynamic_names_are_valid_sorted_and_never_take_a_builtin() -> None:
    long = "x" * 80
    tools = dynamic_tools(
        [
            announce("zeta.search"),
            announce("Read"),
            announce("read", tool="other"),
            announce(long),
            announce(long + "y"),
            announce("zeta.search"),  # the same definition twice: one tool
        ],
        REGISTRY,
    )
    names = [s.name for s in tools.specs]
    assert names == sorted(names) and len(names) == len(set(names)) == 5
    assert "Read" not in tools.tools and "read" not in tools.tools
    # Apart from the built-in and, in any case, from each other.
    assert names[:2] == ["mcp_Read", "mcp_read_2"] and names[-1] == "zeta_search"
    longs = [n for n in names if n.startswith("xxx")]
    assert len(longs) == 2 and all(len(n) == MAX_NAME for n in longs) and longs[0] != longs[1]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n) for n in names)


def test_dynamic_specs_are_stable_canonical_and_order_free() -> None:
    defs = [
        announce("b-tool", schema={"type": "object", "properties": {"z": {"type": "number", "minimum": 0}}}),
        announce("a-tool", schema={"properties": {}}),
        announce("c-tool", schema="not an object"),
    ]
    one, two = dynamic_tools(defs, REGISTRY), dynamic_tools(list(reversed(defs)), REGISTRY)
    assert one.specs == two.specs
    by_name = {s.name: s for s in one.specs}
    assert (
        by_name["b-tool"].parameters_json
        == '{"properties":{"z":{"minimum":0,"type":"number"}},"type":"object"}'
    )
    assert by_name["a-tool"].parameters_json == '{"properties":{},"type":"object"}'
    assert by_name["c-tool"].parameters_json == '{"properties":{},"type":"object"}'
    assert by_name["a-tool"].description == "The MCP tool t of p."


def test_a_mode_offers_announced_tools_only_with_mcp() -> None:
    tools = dynamic_tools([announce("notes-add")], REGISTRY)
    read = ToolSpec("Read", "r", "{}")
    call = ToolSpec("CallMcpTool", "c", "{}")
    assert tools.offered((read,)) == (read,)
    assert [s.name for s in tools.offered((read, call))] == ["Read", "CallMcpTool", "notes-add"]
    assert DynamicTools().offered((read, call)) == (read, call)


def test_run_tools_come_from_both_places_the_request_announces_them() -> None:
    context = agent.RequestContext(tools=[announce("user-notes-add", tool="add")])
    start = RunStart(
        request_id="r",
        conversation_id="c",
        model_id="m",
        action="user_message_action",
        user_message=None,
        request_context=context,
        mode=agent.AgentMode.AGENT,
        client_state=None,
        mcp_tools=agent.McpTools(
            mcp_tools=[announce("user-web-fetch", tool="fetch"), announce("user-notes-add", tool="add")]
        ),
    )
    assert len(announced(start)) == 3
    registry, dynamic = run_tools(start, REGISTRY)
    assert set(dynamic.tools) == {"user-notes-add", "user-web-fetch"}
    assert set(REGISTRY) < set(registry)


def test_a_dynamic_tool_sends_its_announced_definition() -> None:
    definition = announce("user-notes-add", tool="add", provider="notes", schema=SCHEMA)
    tools = dynamic_tools([definition], REGISTRY)
    r = Round({**REGISTRY, **tools.tools})
    r.call("c1", "user-notes-add", {"text": "hi"})
    (sent,) = r.execs()
    assert (sent.mcp_args.name, sent.mcp_args.provider_identifier, sent.mcp_args.tool_name) == (
        "user-notes-add",
        "notes",
        "add",
    )
    assert sent.mcp_args.args == {"text": json_value("hi")} and sent.mcp_args.tool_call_id == "c1"
    r.answer(mcp_result=agent.McpResult(error=agent.McpError(error="disk full")))
    assert r.done["c1"].content == "The MCP tool user-notes-add failed: disk full"
