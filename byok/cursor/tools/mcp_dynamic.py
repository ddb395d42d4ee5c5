"""MCP tools the client announces in the run request, offered to the model under their own
names (sans-IO).

Cursor may list MCP tools in the run request (``RequestContext.tools``,
``AgentRunRequest.mcp_tools``). As the reference does, each becomes a tool of the run ("dynamic"
tools): a call goes out as ``mcp_args`` carrying the announced definition as it is, answered by
``mcp_result`` like CallMcpTool.

The tool list is part of every provider request's cached prefix, so it must not change while
the announced tools do not: definitions are deduplicated and sorted, names made valid for the
providers (``^[A-Za-z0-9_-]{1,64}$``) deterministically, schemas written as canonical JSON. A name
that would take a built-in tool's (in any case) gets an ``mcp_`` prefix: a dynamic tool never
shadows one of byok's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs

from byok.cursor.request import RunStart
from byok.cursor.tools.base import Invocation, OneShot, ToolDef
from byok.cursor.tools.mcp_results import call_card, value_json
from byok.cursor.tools.mcp_tools import mcp_args, mcp_exec
from byok.model.messages import canonical_json
from byok.model.request import ToolSpec
from byok.pb.agent import v1 as agent

MAX_NAME = 64
_INVALID = re.compile(r"[^A-Za-z0-9_-]")
_EMPTY_SCHEMA = {"type": "object", "properties": {}}
# A mode offers the announced MCP tools when it offers MCP calls at all.
MCP_GATE = "CallMcpTool"


@attrs.frozen
class DynamicTools:
    specs: tuple[ToolSpec, ...] = ()  # in name order
    tools: Mapping[str, ToolDef] = attrs.field(factory=dict)

    def offered(self, mode_specs: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
        """What a mode offers: its own tools, then (when it offers MCP) the announced ones."""
        if not self.specs or not any(s.name == MCP_GATE for s in mode_specs):
            return mode_specs
        return (*mode_specs, *self.specs)


def announced(start: RunStart) -> list[agent.McpToolDefinition]:
    found = list(start.request_context.tools) if start.request_context is not None else []
    if start.mcp_tools is not None:
        found.extend(start.mcp_tools.mcp_tools)
    return found


def dynamic_tools(definitions: Iterable[agent.McpToolDefinition], reserved: Collection[str]) -> DynamicTools:
    """The tools for ``definitions``, named apart from ``reserved`` (byok's own tool names)."""
    unique = {bytes(d): d for d in definitions if d.tool_name or d.name}
    taken = {name.lower() for name in reserved}
    specs: list[ToolSpec] = []
    tools: dict[str, ToolDef] = {}
    for data in sorted(unique, key=lambda b: (_wanted(unique[b]), b)):
        definition = unique[data]
        name = _free_name(_wanted(definition), taken)
        taken.add(name.lower())
        specs.append(ToolSpec(name, _description(definition), canonical_json(_schema(definition)).decode()))
        tools[name] = _tool(name, definition)
    specs.sort(key=lambda s: s.name)
    return DynamicTools(tuple(specs), tools)


def _wanted(definition: agent.McpToolDefinition) -> str:
    return definition.name or definition.tool_name


def _valid(name: str) -> str:
    clean = _INVALID.sub("_", name) or "mcp_tool"
    if len(clean) <= MAX_NAME:
        return clean
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{clean[: MAX_NAME - 9]}_{digest}"


def _free_name(wanted: str, taken: set[str]) -> str:
    name = _valid(wanted)
    if name.lower() in taken:
        name = _valid("mcp_" + name)
    n = 2
    base = name
    while name.lower() in taken:
        suffix = f"_{n}"
        name = base[: MAX_NAME - len(suffix)] + suffix
        n += 1
    return name


def _description(definition: agent.McpToolDefinition) -> str:
    text = definition.description.strip()
    source = definition.provider_identifier or "an MCP server"
    return text or f"The MCP tool {definition.tool_name or definition.name} of {source}."


def _schema(definition: agent.McpToolDefinition) -> dict[str, Any]:
    schema = value_json(definition.input_schema)
    if not isinstance(schema, dict):
        return dict(_EMPTY_SCHEMA)
    if "type" not in schema:
        return {"type": "object", **schema}
    return schema if schema["type"] == "object" else dict(_EMPTY_SCHEMA)


def _tool(name: str, definition: agent.McpToolDefinition) -> ToolDef:
    def parse(args: Mapping[str, Any]) -> Mapping[str, Any]:
        return dict(args)

    def ui(args: Mapping[str, Any]) -> agent.McpToolCall:
        card = call_card(mcp_args(definition, args, ""))
        assert card.mcp_tool_call is not None
        return card.mcp_tool_call

    def execute(inv: Invocation) -> OneShot:
        return mcp_exec(mcp_args(definition, inv.args, inv.call_id), name)

    return ToolDef(
        name=name,
        ui_field="mcp_tool_call",
        placeholder=agent.McpToolCall,
        parse=parse,
        ui=ui,
        execute=execute,
    )


def run_tools(start: RunStart, registry: Mapping[str, ToolDef]) -> tuple[dict[str, ToolDef], DynamicTools]:
    """A run's tools: byok's own, and the announced MCP tools beside them (never over them)."""
    dynamic = dynamic_tools(announced(start), registry)
    return {**registry, **dynamic.tools}, dynamic
