"""GetMcpTools' answer (sans-IO): the client's live MCP state, filtered as the model asked and
written as JSON for it, and the run's definition table filled from it.

Four ways to ask, as Cursor's own GetMcpTools offers them: nothing (every server, its tools with
short descriptions), ``server`` (that server's tools, full descriptions and input schemas),
``server`` + ``toolName`` (one tool), ``pattern`` (a regular expression searched in server
identifiers and tool names, optionally within ``server``). Servers and tools come sorted, so the
same state always gives the same text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import attrs

from byok.cursor.tools.mcp_results import pretty_json, value_json
from byok.pb.agent import v1 as agent

MAX_PATTERN = 256  # characters; a longer pattern is an argument error
SHORT_DESCRIPTION = 200  # characters of a description in the catalog and in search results
_TRUNCATED = "... [truncated]"
_SPACE = re.compile(r"[\x00-\x20\x7f]+")

McpTable = MutableMapping[tuple[str, str], agent.McpToolDefinition]


class CatalogError(Exception):
    """The request cannot be answered from this state (no such server or tool, a bad pattern):
    the message is the tool error the model reads."""


@attrs.frozen
class StateQuery:
    server: str | None = None
    tool_name: str | None = None
    pattern: str | None = None


def learn(table: McpTable, servers: Iterable[agent.McpStateServer]) -> None:
    """Record every tool of a successful state exactly as the client gave it, keyed by
    (server_identifier, tool_name): what CallMcpTool sends is taken from here, never made up."""
    for server in servers:
        for tool in server.tools:
            table[(server.server_identifier, tool.tool_name)] = tool


def render(servers: Sequence[agent.McpStateServer], query: StateQuery) -> str:
    ordered = sorted(servers, key=lambda s: s.server_identifier)
    if query.pattern is not None and query.tool_name is None:
        return _search(ordered, query)
    if query.server is None:
        return _catalog(ordered)
    server = _find(ordered, query.server)
    if query.tool_name is None:
        return pretty_json({**_server_head(server, full=True), "tools": _tools(server.tools, full=True)})
    tool = next((t for t in server.tools if t.tool_name == query.tool_name), None)
    if tool is None:
        status = f" (its status is {server.status!r})" if server.status not in (None, "", "ready") else ""
        names = ", ".join(sorted(t.tool_name for t in server.tools)) or "none"
        raise CatalogError(
            f"MCP tool {query.tool_name!r} not found on server {query.server!r}{status}. Its tools: {names}."
        )
    return pretty_json({**_server_head(server, full=True), "tool": _tool(tool, full=True)})


def _catalog(servers: Sequence[agent.McpStateServer]) -> str:
    if not servers:
        return pretty_json({"servers": [], "note": "No MCP servers are connected in Cursor."})
    return pretty_json(
        {"servers": [{**_server_head(s, full=False), "tools": _tools(s.tools)} for s in servers]}
    )


def _search(servers: Sequence[agent.McpStateServer], query: StateQuery) -> str:
    assert query.pattern is not None
    try:
        regex = re.compile(query.pattern)
    except re.error as e:
        raise CatalogError(f"Invalid regex pattern {query.pattern!r}: {e}.") from None
    scope = [_find(servers, query.server)] if query.server is not None else servers
    matches: list[dict[str, Any]] = []
    for server in scope:
        whole = regex.search(server.server_identifier) is not None
        if whole:
            matches.append(_server_head(server, full=False))
        for tool in sorted(server.tools, key=lambda t: t.tool_name):
            if whole or regex.search(tool.tool_name):
                matches.append({"server": server.server_identifier, **_tool(tool)})
    return pretty_json({"pattern": query.pattern, "matches": matches})


def _find(servers: Sequence[agent.McpStateServer], identifier: str) -> agent.McpStateServer:
    for server in servers:
        if server.server_identifier == identifier:
            return server
    available = ", ".join(s.server_identifier for s in servers)
    listed = f" Available servers: {available}." if available else " No MCP servers are connected in Cursor."
    raise CatalogError(f"MCP server {identifier!r} not found.{listed}")


def _server_head(server: agent.McpStateServer, *, full: bool) -> dict[str, Any]:
    head: dict[str, Any] = {"server": server.server_identifier}
    if server.server_name and server.server_name != server.server_identifier:
        head["name"] = server.server_name
    if server.status:
        head["status"] = server.status
    instructions = "\n".join(i.instructions for i in server.instructions if i.instructions)
    if instructions:
        head["instructions"] = instructions if full else _short(instructions)
    return head


def _tools(tools: Iterable[agent.McpToolDefinition], *, full: bool = False) -> list[dict[str, Any]]:
    return [_tool(t, full=full) for t in sorted(tools, key=lambda t: t.tool_name)]


def _tool(tool: agent.McpToolDefinition, *, full: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"tool": tool.tool_name}
    description = tool.description.strip() if full else _short(tool.description)
    if description:
        out["description"] = description
    if full and tool.input_schema is not None:
        out["inputSchema"] = value_json(tool.input_schema)
    return out


def _short(text: str) -> str:
    flat = _SPACE.sub(" ", text).strip()
    if len(flat) <= SHORT_DESCRIPTION:
        return flat
    return flat[: SHORT_DESCRIPTION - len(_TRUNCATED)] + _TRUNCATED
