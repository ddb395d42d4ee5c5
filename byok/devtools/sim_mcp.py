"""A pretend MCP server the simulated Cursor client hosts: two tools and one resource.

It answers the MCP Execs as Cursor's client does for a connected server:
  mcp_state_exec_args          -> mcp_state_exec_result (the server and its tool definitions; an
                                  error, a rejection or a throw when told to)
  mcp_args                     -> mcp_result (the tool's result, an error, a rejection, or
                                  tool_not_found when name, provider_identifier and tool_name are
                                  not exactly a definition's: Cursor finds the tool by them)
  read_mcp_resource_exec_args  -> read_mcp_resource_exec_result
  list_mcp_resources_exec_args -> list_mcp_resources_exec_result
each followed by ``stream_close``. ``answer`` is a ``CursorSim.on_exec`` (None for any other
exec, which then goes to the workspace), and a ``WorkspaceExecutor`` takes one as ``mcp``.

The definitions look like a real client's (seeds 000 §33.3): the server identifier, the
definition's name and its provider identifier differ, so a server that derives one from another
sends a call this server does not find.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import betterproto2

from byok.devtools.exec_client import exec_result, stream_close, throw
from byok.pb.agent import v1 as agent
from byok.pb.google import protobuf as pb

SERVER = "user-sim-notes"  # the server identifier
SERVER_NAME = "sim-notes"
PROVIDER = "notes"  # the provider identifier Cursor's definitions carry
README = "notes://readme"
README_TEXT = "# Sim notes\n\nA pretend MCP server for byok's tests.\n"


def _schema(**properties: str) -> pb.Value:
    fields = {name: {"type": kind} for name, kind in properties.items()}
    schema = {"type": "object", "properties": fields, "required": sorted(properties)}
    return pb.Value.from_dict(schema)


TOOLS = (
    agent.McpToolDefinition(
        name=f"{SERVER}-add_note",
        provider_identifier=PROVIDER,
        tool_name="add_note",
        description="Add a note. Returns its number.",
        input_schema=_schema(text="string"),
    ),
    agent.McpToolDefinition(
        name=f"{SERVER}-search_notes",
        provider_identifier=PROVIDER,
        tool_name="search_notes",
        description="Search the notes for a word. An empty query is the tool's own error.",
        input_schema=_schema(query="string"),
    ),
)


@attrs.define(eq=False)
class SimMcp:
    state: str = "success"  # "success" | "error" | "rejected" | "throw": how mcp_state_exec_args ends
    errors: Mapping[str, str] = attrs.Factory(dict)  # tool name -> the McpError its calls get
    rejected: frozenset[str] = frozenset()  # tool names the user rejects
    notes: list[str] = attrs.Factory(list)
    # What the server was asked, in order.
    state_requests: list[agent.McpStateExecArgs] = attrs.Factory(list)
    calls: list[agent.McpArgs] = attrs.Factory(list)
    reads: list[agent.ReadMcpResourceExecArgs] = attrs.Factory(list)

    def definitions(self) -> list[agent.McpToolDefinition]:
        return [agent.McpToolDefinition().parse(bytes(t)) for t in TOOLS]

    def answer(self, msg: agent.ExecServerMessage) -> list[agent.AgentClientMessage] | None:
        kind, args = betterproto2.which_one_of(msg, "message")
        if kind == "mcp_state_exec_args":
            self.state_requests.append(args)
            if self.state == "throw":
                return [throw(msg.id, "the MCP state is not available")]
            return [exec_result(msg, mcp_state_exec_result=self._state(args)), stream_close(msg.id)]
        if kind == "mcp_args":
            self.calls.append(args)
            return [exec_result(msg, mcp_result=self._call(args)), stream_close(msg.id)]
        if kind == "read_mcp_resource_exec_args":
            self.reads.append(args)
            return [exec_result(msg, read_mcp_resource_exec_result=self._read(args)), stream_close(msg.id)]
        if kind == "list_mcp_resources_exec_args":
            return [exec_result(msg, list_mcp_resources_exec_result=self._list(args)), stream_close(msg.id)]
        return None

    # --- the state ------------------------------------------------------------------------------
    def _state(self, args: agent.McpStateExecArgs) -> agent.McpStateExecResult:
        if self.state == "error":
            return agent.McpStateExecResult(error=agent.McpStateError(error="the MCP process crashed"))
        if self.state == "rejected":
            return agent.McpStateExecResult(rejected=agent.McpStateRejected(reason="MCP is disabled"))
        server = agent.McpStateServer(
            server_name=SERVER_NAME,
            server_identifier=SERVER,
            tools=self.definitions(),
            instructions=[
                agent.McpInstructions(
                    server_name=SERVER_NAME, instructions="Notes live in memory.", server_identifier=SERVER
                )
            ],
            status="ready",
        )
        wanted = args.server_identifiers
        servers = [server] if not wanted or SERVER in wanted else []
        return agent.McpStateExecResult(success=agent.McpStateSuccess(servers=servers))

    # --- the tools --------------------------------------------------------------------------------
    def _call(self, args: agent.McpArgs) -> agent.McpResult:
        found = next(
            (
                t
                for t in TOOLS
                if (t.name, t.provider_identifier, t.tool_name)
                == (args.name, args.provider_identifier, args.tool_name)
            ),
            None,
        )
        if found is None:
            missing = agent.McpToolNotFound(name=args.name, available_tools=[t.name for t in TOOLS])
            return agent.McpResult(tool_not_found=missing)
        tool = found.tool_name
        if tool in self.rejected:
            return agent.McpResult(rejected=agent.McpRejected(reason="the user said no"))
        if tool in self.errors:
            return agent.McpResult(error=agent.McpError(error=self.errors[tool]))
        given = {k: v.to_dict() for k, v in args.args.items()}
        return agent.McpResult(success=self._add(given) if tool == "add_note" else self._search(given))

    def _add(self, given: dict[str, Any]) -> agent.McpSuccess:
        self.notes.append(str(given.get("text", "")))
        count = len(self.notes)
        structured = pb.Struct.from_dict({"number": count, "count": count})
        return agent.McpSuccess(content=[_text(f"Added note #{count}.")], structured_content=structured)

    def _search(self, given: dict[str, Any]) -> agent.McpSuccess:
        query = str(given.get("query", ""))
        if not query:
            return agent.McpSuccess(content=[_text("query must not be empty")], is_error=True)
        hits = [n for n in self.notes if query.lower() in n.lower()]
        return agent.McpSuccess(content=[_text("\n".join(hits) if hits else f"No notes match {query!r}.")])

    # --- the resource --------------------------------------------------------------------------
    def _read(self, args: agent.ReadMcpResourceExecArgs) -> agent.ReadMcpResourceExecResult:
        if args.server != SERVER or args.uri != README:
            return agent.ReadMcpResourceExecResult(not_found=agent.ReadMcpResourceNotFound(uri=args.uri))
        success = agent.ReadMcpResourceSuccess(
            uri=README, name="readme", mime_type="text/markdown", download_path=args.download_path
        )
        if args.download_path is None:
            success.text = README_TEXT
        return agent.ReadMcpResourceExecResult(success=success)

    def _list(self, args: agent.ListMcpResourcesExecArgs) -> agent.ListMcpResourcesExecResult:
        resource = agent.ListMcpResourcesExecResultMcpResource(
            uri=README, name="readme", mime_type="text/markdown", server=SERVER
        )
        resources = [resource] if args.server in (None, "", SERVER) else []
        return agent.ListMcpResourcesExecResult(success=agent.ListMcpResourcesSuccess(resources=resources))


def _text(text: str) -> agent.McpToolResultContentItem:
    return agent.McpToolResultContentItem(text=agent.McpTextContent(text=text))
