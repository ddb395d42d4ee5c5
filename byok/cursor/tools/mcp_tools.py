"""The MCP tools byok offers by name: GetMcpTools, CallMcpTool (and its mcp_auth form),
FetchMcpResource (sans-IO).

- GetMcpTools: one ``mcp_state_exec_args`` Exec (``server_identifiers`` only when the model named
  a server, ``kick_only`` false) asks the client for its live MCP state; a success fills the run's
  definition table (``ToolEnv.mcp``) and is filtered for the model (mcp_catalog.py).
- CallMcpTool: the definition for (server, toolName) from that table goes out as ``mcp_args``
  with its name, provider_identifier and tool_name exactly as the state gave them (seeds 000
  §33.3). A call the table does not know ends at once with a tool error telling the model to
  call GetMcpTools first; nothing is sent. With toolName ``mcp_auth`` it asks the user to
  authenticate the server instead (``mcp_auth_request_query``).
- FetchMcpResource: one ``read_mcp_resource_exec_args`` Exec.

ListMcpResources is not offered: neither reference's current tool lists nor the tool names a
real Cursor run allows carry it (PROTOCOL §5, seeds 000 §32).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from byok.cursor.tools.base import (
    Action,
    Finish,
    Invocation,
    OneShot,
    Phased,
    SendQuery,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_text,
    require_str,
)
from byok.cursor.tools.exec_results import no_variant, typed_one_shot, variant, with_detail
from byok.cursor.tools.mcp_catalog import MAX_PATTERN, CatalogError, StateQuery, learn, render
from byok.cursor.tools.mcp_results import (
    call_card,
    call_error,
    call_outcome,
    json_value,
    resource_card,
    resource_error,
    resource_outcome,
)
from byok.pb.agent import v1 as agent

MCP_AUTH = "mcp_auth"

# --- GetMcpTools -----------------------------------------------------------------------------------


def _parse_get(args: Mapping[str, Any]) -> Mapping[str, Any]:
    server, tool_name, pattern = (optional_text(args, k) for k in ("server", "toolName", "pattern"))
    if tool_name is not None and server is None:
        raise ToolArgError("toolName requires server to be set")
    if pattern is not None and len(pattern) > MAX_PATTERN:
        raise ToolArgError(f"pattern must not be longer than {MAX_PATTERN} characters")
    return {"server": server, "toolName": tool_name, "pattern": pattern}


def _get_args(args: Mapping[str, Any], call_id: str = "") -> agent.GetMcpToolsArgs:
    return agent.GetMcpToolsArgs(
        server=args["server"], tool_name=args["toolName"], pattern=args["pattern"], tool_call_id=call_id
    )


def _get_card(args: agent.GetMcpToolsArgs, result: agent.GetMcpToolsAgentResult) -> agent.ToolCall:
    return agent.ToolCall(get_mcp_tools_tool_call=agent.GetMcpToolsToolCall(args=args, result=result))


def _get_error(args: agent.GetMcpToolsArgs, message: str) -> ToolOutcome:
    result = agent.GetMcpToolsAgentResult(error=agent.GetMcpToolsError(error=message))
    return ToolOutcome(message, True, _get_card(args, result))


def _get_outcome(
    inv: Invocation, card_args: agent.GetMcpToolsArgs, result: agent.McpStateExecResult
) -> ToolOutcome:
    kind, value = variant(result)
    if kind == "success":
        if inv.env is not None:
            learn(inv.env.mcp, value.servers)
        query = StateQuery(inv.args["server"], inv.args["toolName"], inv.args["pattern"])
        try:
            text = render(value.servers, query)
        except CatalogError as e:
            return _get_error(card_args, str(e))
        success = agent.GetMcpToolsAgentResult(success=agent.GetMcpToolsSuccess(content=text))
        return ToolOutcome(text, False, _get_card(card_args, success))
    if kind == "error":
        return _get_error(card_args, with_detail("Cursor could not report its MCP servers", value.error))
    if kind == "rejected":
        return _get_error(card_args, with_detail("Listing the MCP tools was rejected", value.reason))
    return _get_error(card_args, no_variant("mcp_state_exec_result"))


def _execute_get(inv: Invocation) -> OneShot:
    card_args = _get_args(inv.args, inv.call_id)
    server = inv.args["server"]
    state = agent.McpStateExecArgs(server_identifiers=[server] if server else [], kick_only=False)
    return typed_one_shot(
        agent.ExecServerMessage(mcp_state_exec_args=state),
        "mcp_state_exec_result",
        lambda r: _get_outcome(inv, card_args, r),
        lambda e: _get_error(card_args, e),
    )


GET_MCP_TOOLS = ToolDef(
    name="GetMcpTools",
    ui_field="get_mcp_tools_tool_call",
    placeholder=agent.GetMcpToolsToolCall,
    parse=_parse_get,
    ui=lambda args: agent.GetMcpToolsToolCall(args=_get_args(args)),
    execute=_execute_get,
)

# --- CallMcpTool ---------------------------------------------------------------------------------------


def tool_arguments(args: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The MCP tool's own arguments: an object, or (a common slip) a JSON string of one."""
    value = args.get(key)
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ToolArgError(f"argument '{key}' must be an object, got a string that is not JSON") from None
    if not isinstance(value, dict):
        raise ToolArgError(f"argument '{key}' must be an object, got {type(value).__name__}")
    return value


def is_mcp_auth(tool_name: str) -> bool:
    return "".join(c for c in tool_name.lower() if c.isalnum()) == "mcpauth"


def _parse_call(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "server": require_str(args, "server"),
        "toolName": require_str(args, "toolName"),
        "arguments": tool_arguments(args, "arguments"),
    }


def mcp_args(
    definition: agent.McpToolDefinition, arguments: Mapping[str, Any], call_id: str
) -> agent.McpArgs:
    return agent.McpArgs(
        name=definition.name,
        args={k: json_value(v) for k, v in arguments.items()},
        tool_call_id=call_id,
        provider_identifier=definition.provider_identifier,
        tool_name=definition.tool_name,
    )


def mcp_exec(args: agent.McpArgs, label: str) -> OneShot:
    return typed_one_shot(
        agent.ExecServerMessage(mcp_args=args),
        "mcp_result",
        lambda r: call_outcome(args, r, label),
        lambda e: call_error(args, e),
    )


def _auth_args(args: Mapping[str, Any], call_id: str = "") -> agent.McpAuthArgs:
    return agent.McpAuthArgs(server_identifier=args["server"], tool_call_id=call_id)


def _call_ui(args: Mapping[str, Any]) -> agent.McpToolCall | agent.ToolCall:
    if is_mcp_auth(args["toolName"]):
        return agent.ToolCall(mcp_auth_tool_call=agent.McpAuthToolCall(args=_auth_args(args)))
    # The definition is the table's, known when the call runs; the completed card has it all.
    shown = agent.McpArgs(
        name=args["toolName"],
        args={k: json_value(v) for k, v in args["arguments"].items()},
        tool_name=args["toolName"],
    )
    return agent.McpToolCall(args=shown)


class Immediate:
    """An Execution that finishes as it starts, with nothing sent."""

    def __init__(self, outcome: ToolOutcome) -> None:
        self._outcome = outcome

    def start(self) -> list[Action]:
        return [Finish(self._outcome)]

    def on_result(self, msg: agent.ExecClientMessage) -> list[Action]:
        return []

    def on_stream_close(self) -> list[Action]:
        return []

    def on_throw(self, error: str) -> list[Action]:
        return []


def _unknown_definition(inv: Invocation) -> ToolOutcome:
    server, tool = inv.args["server"], inv.args["toolName"]
    text = (
        f"Error: this run does not know the MCP tool {tool!r} on server {server!r}: call GetMcpTools "
        f'(for example {{"server": "{server}"}}) first, then call CallMcpTool with the server and '
        "toolName exactly as it lists them. The tool was not called."
    )
    shown = agent.McpArgs(name=tool, tool_name=tool, tool_call_id=inv.call_id)
    return ToolOutcome(
        text, True, call_card(shown, agent.McpToolResult(error=agent.McpToolError(error=text)))
    )


def _execute_call(inv: Invocation) -> Any:
    if is_mcp_auth(inv.args["toolName"]):
        return McpAuth(inv)
    table = {} if inv.env is None else inv.env.mcp
    definition = table.get((inv.args["server"], inv.args["toolName"]))
    if definition is None:
        return Immediate(_unknown_definition(inv))
    label = f"{inv.args['server']}/{definition.tool_name}"
    return mcp_exec(mcp_args(definition, inv.args["arguments"], inv.call_id), label)


class McpAuth(Phased):
    """CallMcpTool with toolName mcp_auth: the user is asked to authenticate the server."""

    def __init__(self, inv: Invocation) -> None:
        self.args = _auth_args(inv.args, inv.call_id)

    def start(self) -> list[Action]:
        query = agent.InteractionQuery(mcp_auth_request_query=agent.McpAuthRequestQuery(args=self.args))
        return [SendQuery(query)]

    def _card(self, result: agent.McpAuthResult) -> agent.ToolCall:
        return agent.ToolCall(mcp_auth_tool_call=agent.McpAuthToolCall(args=self.args, result=result))

    def fail(self, message: str) -> list[Action]:
        result = agent.McpAuthResult(error=agent.McpAuthError(error=message))
        return self.finish(ToolOutcome(message, True, self._card(result)))

    def on_answer(self, response: agent.InteractionResponse) -> list[Action]:
        answer = response.mcp_auth_request_response
        if self.done:
            return []
        if answer is None:
            return self._unexpected("interaction response")
        kind, value = variant(answer)
        server = self.args.server_identifier
        if kind == "approved":
            text = f"The MCP server {server!r} is authenticated. Call GetMcpTools to see its tools now."
            result = agent.McpAuthResult(success=agent.McpAuthSuccess(server_identifier=server))
            return self.finish(ToolOutcome(text, False, self._card(result)))
        if kind == "rejected":
            text = with_detail(f"The user declined to authenticate the MCP server {server!r}", value.reason)
            result = agent.McpAuthResult(rejected=agent.McpAuthRejected(reason=value.reason))
            return self.finish(ToolOutcome(text, True, self._card(result)))
        return self.fail(no_variant("mcp_auth_request_response"))


CALL_MCP_TOOL = ToolDef(
    name="CallMcpTool",
    ui_field="mcp_tool_call",
    placeholder=agent.McpToolCall,
    parse=_parse_call,
    ui=_call_ui,
    execute=_execute_call,
)

# --- FetchMcpResource --------------------------------------------------------------------------------


def _parse_fetch(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "server": require_str(args, "server"),
        "uri": require_str(args, "uri"),
        "downloadPath": optional_text(args, "downloadPath"),
    }


def _fetch_args(args: Mapping[str, Any]) -> agent.ReadMcpResourceExecArgs:
    return agent.ReadMcpResourceExecArgs(
        server=args["server"], uri=args["uri"], download_path=args["downloadPath"]
    )


def _execute_fetch(inv: Invocation) -> OneShot:
    args = _fetch_args(inv.args)
    return typed_one_shot(
        agent.ExecServerMessage(read_mcp_resource_exec_args=args),
        "read_mcp_resource_exec_result",
        lambda r: resource_outcome(args, r),
        lambda e: resource_error(args, e),
    )


FETCH_MCP_RESOURCE = ToolDef(
    name="FetchMcpResource",
    ui_field="read_mcp_resource_tool_call",
    placeholder=agent.ReadMcpResourceToolCall,
    parse=_parse_fetch,
    ui=lambda args: resource_card(_fetch_args(args)).read_mcp_resource_tool_call,
    execute=_execute_fetch,
)


TOOLS: tuple[ToolDef, ...] = (GET_MCP_TOOLS, CALL_MCP_TOOL, FETCH_MCP_RESOURCE)
