"""The MCP result compiler (cursor/tools/mcp_results.py) and GetMcpTools' filtering of the
client's state (cursor/tools/mcp_catalog.py): values in, strings and typed cards out."""

from __future__ import annotations

import json

import pytest

from byok.cursor.tools.mcp_catalog import CatalogError, StateQuery, learn, render
from byok.cursor.tools.mcp_results import (
    call_outcome,
    json_value,
    resource_outcome,
    success_text,
    value_json,
)
from byok.pb.agent import v1 as agent
from byok.pb.google import protobuf as pb

ARGS = agent.McpArgs(name="user-notes-add", tool_name="add", provider_identifier="notes", tool_call_id="c1")


def text_item(text: str, location: agent.OutputLocation | None = None) -> agent.McpToolResultContentItem:
    return agent.McpToolResultContentItem(text=agent.McpTextContent(text=text, output_location=location))


def struct(obj: dict) -> pb.Struct:
    value = json_value(obj)
    assert value.struct_value is not None
    return value.struct_value


# --- values ---------------------------------------------------------------------------------------


def test_json_values_round_trip_with_integral_numbers_as_ints() -> None:
    obj = {"a": [1, 2.5, None, True, "x"], "b": {"c": {}}, "n": -3}
    assert value_json(json_value(obj)) == obj
    assert json.dumps(value_json(json_value({"maxItems": 10}))) == '{"maxItems": 10}'
    assert value_json(pb.Value()) is None  # no kind set: null, never a crash
    assert value_json(None) is None


# --- CallMcpTool results ----------------------------------------------------------------------------


def test_success_compiles_text_output_location_and_structured_content() -> None:
    where = agent.OutputLocation(file_path="/tmp/out.txt", size_bytes=90000, line_count=1200)
    success = agent.McpSuccess(
        content=[
            text_item("first part"),
            text_item("long output, cut", where),
            agent.McpToolResultContentItem(
                image=agent.McpImageContent(data=b"\x89PNG", mime_type="image/png")
            ),
        ],
        structured_content=struct({"count": 2, "ids": ["a", "b"]}),
    )
    out = call_outcome(ARGS, agent.McpResult(success=success), "user-notes/add")
    assert not out.is_error
    parts = out.content.split("\n\n")
    assert parts[0] == "first part"
    assert parts[1].startswith(
        "long output, cut\n[The full output (90000 bytes, 1200 lines) is in /tmp/out.txt"
    )
    assert parts[2] == "[an image (image/png, 4 bytes) that cannot be shown here]"
    assert out.content.endswith(
        'Structured content:\n{\n  "count": 2,\n  "ids": [\n    "a",\n    "b"\n  ]\n}'
    )
    card = out.ui.mcp_tool_call
    assert card.args == ARGS and card.result.success == success


def test_structured_content_the_text_already_carries_is_not_repeated() -> None:
    success = agent.McpSuccess(content=[text_item('{"ok": true}')], structured_content=struct({"ok": True}))
    assert success_text(success) == '{"ok": true}'


def test_empty_success() -> None:
    assert success_text(agent.McpSuccess()) == "The MCP tool returned no content."


def test_is_error_is_kept_and_said_in_the_text() -> None:
    success = agent.McpSuccess(content=[text_item("quota exceeded")], is_error=True)
    out = call_outcome(ARGS, agent.McpResult(success=success), "user-notes/add")
    assert out.is_error
    assert out.content == "The MCP tool user-notes/add reported an error:\nquota exceeded"
    assert out.ui.mcp_tool_call.result.success.is_error


@pytest.mark.parametrize(
    ("result", "text", "card_field"),
    [
        (agent.McpResult(error=agent.McpError(error="boom")), "The MCP tool s/t failed: boom", "error"),
        (
            agent.McpResult(rejected=agent.McpRejected(reason="not now")),
            "The user rejected the MCP tool call s/t: not now",
            "rejected",
        ),
        (
            agent.McpResult(permission_denied=agent.McpPermissionDenied(error="read-only")),
            "Permission denied for the MCP tool s/t: read-only",
            "permission_denied",
        ),
        (
            agent.McpResult(tool_not_found=agent.McpToolNotFound(name="t", available_tools=["a", "b"])),
            "MCP tool 't' was not found. Available tools: a, b. Call GetMcpTools",
            "error",
        ),
        (
            agent.McpResult(server_not_found=agent.McpServerNotFound(name="s", available_servers=[])),
            "MCP server 's' was not found. Call GetMcpTools",
            "error",
        ),
        (agent.McpResult(approved=agent.McpApproved()), "protocol error", "error"),
        (agent.McpResult(), "protocol error: mcp_result carries no result", "error"),
    ],
)
def test_failures(result: agent.McpResult, text: str, card_field: str) -> None:
    out = call_outcome(ARGS, result, "s/t")
    assert out.is_error and out.content.startswith(text)
    assert getattr(out.ui.mcp_tool_call.result, card_field) is not None


# --- FetchMcpResource results ------------------------------------------------------------------------

RES = agent.ReadMcpResourceExecArgs(server="user-notes", uri="notes://readme")


def test_resource_text_blob_and_download() -> None:
    text = agent.ReadMcpResourceSuccess(uri="notes://readme", mime_type="text/markdown", text="# Notes\n")
    out = resource_outcome(RES, agent.ReadMcpResourceExecResult(success=text))
    assert (out.content, out.is_error) == ("# Notes\n", False)
    assert out.ui.read_mcp_resource_tool_call.args == RES
    blob = agent.ReadMcpResourceSuccess(uri="notes://logo", mime_type="image/png", blob=b"123")
    out = resource_outcome(RES, agent.ReadMcpResourceExecResult(success=blob))
    assert "binary (image/png, 3 bytes)" in out.content and "downloadPath" in out.content
    saved = agent.ReadMcpResourceSuccess(uri="notes://readme", download_path="docs/readme.md", text="x")
    out = resource_outcome(RES, agent.ReadMcpResourceExecResult(success=saved))
    assert out.content == "Saved the MCP resource notes://readme to docs/readme.md."


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (
            agent.ReadMcpResourceExecResult(error=agent.ReadMcpResourceError(uri="notes://x", error="io")),
            "Cannot read the MCP resource notes://x: io",
        ),
        (
            agent.ReadMcpResourceExecResult(rejected=agent.ReadMcpResourceRejected(reason="no")),
            "Reading the MCP resource notes://readme was rejected: no",
        ),
        (
            agent.ReadMcpResourceExecResult(not_found=agent.ReadMcpResourceNotFound(uri="notes://y")),
            "The MCP resource notes://y was not found on the server 'user-notes'.",
        ),
        (
            agent.ReadMcpResourceExecResult(),
            "protocol error: read_mcp_resource_exec_result carries no result",
        ),
    ],
)
def test_resource_failures(result: agent.ReadMcpResourceExecResult, text: str) -> None:
    out = resource_outcome(RES, result)
    assert out.is_error and out.content == text


# --- GetMcpTools: the state, filtered --------------------------------------------------------------


def definition(
    server: str, tool: str, description: str = "", schema: dict | None = None
) -> agent.McpToolDefinition:
    return agent.McpToolDefinition(
        name=f"{server}-{tool}",
        provider_identifier=server.removeprefix("user-"),
        tool_name=tool,
        description=description,
        input_schema=json_value(schema) if schema is not None else None,
    )


SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
STATE = [
    agent.McpStateServer(
        server_name="web",
        server_identifier="user-web",
        status="needsAuth",
        tools=[definition("user-web", "fetch", "Fetch a page.")],
    ),
    agent.McpStateServer(
        server_name="notes",
        server_identifier="user-notes",
        tools=[
            definition("user-notes", "search", "Search notes. " + "x" * 300),
            definition("user-notes", "add", "Add a note.", SCHEMA),
        ],
        instructions=[agent.McpInstructions(server_name="notes", instructions="Keep notes short.")],
    ),
]


def test_catalog_lists_servers_and_tools_sorted_with_short_descriptions() -> None:
    out = json.loads(render(STATE, StateQuery()))
    assert [s["server"] for s in out["servers"]] == ["user-notes", "user-web"]
    notes, web = out["servers"]
    assert [t["tool"] for t in notes["tools"]] == ["add", "search"]
    assert len(notes["tools"][1]["description"]) == 200 and notes["tools"][1]["description"].endswith(
        "... [truncated]"
    )
    assert "inputSchema" not in notes["tools"][0]
    assert web["status"] == "needsAuth" and notes["name"] == "notes"
    assert render(STATE, StateQuery()) == render(list(reversed(STATE)), StateQuery())  # order-free


def test_a_server_gives_full_descriptions_and_schemas_and_one_tool_in_full() -> None:
    out = json.loads(render(STATE, StateQuery(server="user-notes")))
    add = out["tools"][0]
    assert add == {"tool": "add", "description": "Add a note.", "inputSchema": SCHEMA}
    assert len(out["tools"][1]["description"]) > 300
    assert out["instructions"] == "Keep notes short."
    one = json.loads(render(STATE, StateQuery(server="user-notes", tool_name="add")))
    assert one["tool"] == add and one["server"] == "user-notes"


def test_a_pattern_searches_server_identifiers_and_tool_names() -> None:
    out = json.loads(render(STATE, StateQuery(pattern="^se")))
    assert out["matches"] == [
        {"server": "user-notes", "tool": "search", "description": out["matches"][0]["description"]}
    ]
    whole = json.loads(render(STATE, StateQuery(pattern="web")))["matches"]
    assert [m.get("tool") for m in whole] == [None, "fetch"]  # the server itself, then its tools
    scoped = json.loads(render(STATE, StateQuery(server="user-web", pattern="a")))["matches"]
    assert scoped == []


@pytest.mark.parametrize(
    ("query", "text"),
    [
        (StateQuery(server="nope"), "MCP server 'nope' not found. Available servers: user-notes, user-web."),
        (
            StateQuery(server="user-notes", tool_name="gone"),
            "MCP tool 'gone' not found on server 'user-notes'",
        ),
        (StateQuery(pattern="(unclosed"), "Invalid regex pattern '(unclosed'"),
    ],
)
def test_what_the_state_cannot_answer(query: StateQuery, text: str) -> None:
    with pytest.raises(CatalogError) as info:
        render(STATE, query)
    assert str(info.value).startswith(text)


def test_no_servers() -> None:
    assert json.loads(render([], StateQuery()))["servers"] == []
    with pytest.raises(CatalogError, match="No MCP servers are connected"):
        render([], StateQuery(server="user-notes"))


def test_learn_keys_every_tool_by_server_identifier_and_tool_name() -> None:
    table: dict = {}
    learn(table, STATE)
    assert set(table) == {("user-web", "fetch"), ("user-notes", "search"), ("user-notes", "add")}
    assert table[("user-notes", "add")] is STATE[1].tools[1]  # as the client gave it
