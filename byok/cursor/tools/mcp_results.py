"""MCP results as the model reads them (sans-IO): the client's typed ``McpResult`` and
``ReadMcpResourceExecResult`` compiled into one canonical string each, with the typed card.

A success is never summarised: its text items, where the client spilled a long output to a file
(``output_location``) and its structured content all reach the model (seeds 000 §33.3), and the
tool's own ``is_error`` is kept. Which variant the client set decides success or failure, never
the text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from byok.cursor.tools.base import ToolOutcome
from byok.cursor.tools.exec_results import no_variant, variant, with_detail
from byok.pb.agent import v1 as agent
from byok.pb.google import protobuf as pb

# --- google.protobuf.Value <-> JSON ----------------------------------------------------------------


def value_json(value: pb.Value | None) -> Any:
    """The JSON value a protobuf Value holds; a Value with no kind set is null. Integral numbers
    come back as ints (a schema's ``"maxItems": 10``, not ``10.0``): every double the wire can
    carry that has no fraction is an integer in JSON."""
    if value is None:
        return None
    kind, inner = variant(value, "kind")
    if kind == "number_value":
        return int(inner) if float(inner).is_integer() and abs(inner) < 2**53 else inner
    if kind in ("string_value", "bool_value"):
        return inner
    if kind == "struct_value":
        return struct_json(inner)
    if kind == "list_value":
        return [value_json(v) for v in inner.values]
    return None


def struct_json(struct: pb.Struct | None) -> dict[str, Any]:
    return {} if struct is None else {k: value_json(v) for k, v in struct.fields.items()}


def json_value(obj: Any) -> pb.Value:
    """The protobuf Value for a JSON value (the model's arguments, in their order)."""
    if obj is None:
        return pb.Value(null_value=pb.NullValue.NULL_VALUE)
    if isinstance(obj, bool):
        return pb.Value(bool_value=obj)
    if isinstance(obj, int | float):
        return pb.Value(number_value=float(obj))
    if isinstance(obj, str):
        return pb.Value(string_value=obj)
    if isinstance(obj, list):
        return pb.Value(list_value=pb.ListValue(values=[json_value(v) for v in obj]))
    if isinstance(obj, dict):
        return pb.Value(struct_value=pb.Struct(fields={str(k): json_value(v) for k, v in obj.items()}))
    raise TypeError(f"not a JSON value: {type(obj).__name__}")


def pretty_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True)


# --- CallMcpTool / dynamic MCP tools ------------------------------------------------------------------


def success_text(success: agent.McpSuccess) -> str:
    """The content items in order, then the structured content (unless a text item already is
    that same JSON, as the MCP spec asks servers to send it)."""
    parts: list[str] = []
    texts: list[str] = []
    for item in success.content:
        kind, value = variant(item, "content")
        if kind == "text":
            texts.append(value.text)
            parts.append(value.text + _location_note(value.output_location))
        elif kind == "image":
            mime = value.mime_type or "unknown type"
            parts.append(f"[an image ({mime}, {len(value.data)} bytes) that cannot be shown here]")
    structured = struct_json(success.structured_content) if success.structured_content is not None else None
    if structured and not any(_is_json_of(t, structured) for t in texts):
        parts.append("Structured content:\n" + pretty_json(structured))
    return "\n\n".join(p for p in parts if p) or "The MCP tool returned no content."


def _location_note(location: agent.OutputLocation | None) -> str:
    if location is None or not location.file_path:
        return ""
    size = f"{location.size_bytes} bytes, {location.line_count} lines"
    return f"\n[The full output ({size}) is in {location.file_path}; read that file for the rest.]"


def _is_json_of(text: str, obj: dict[str, Any]) -> bool:
    try:
        return json.loads(text) == obj
    except ValueError:
        return False


def _not_found(kind: str, name: str, available: list[str]) -> str:
    listed = f" Available {kind}s: {', '.join(available)}." if available else ""
    return f"MCP {kind} {name!r} was not found.{listed} Call GetMcpTools to see what Cursor has now."


# McpResult variant -> (text for the model, the card's McpToolResult) for the failures.
_CALL_FAILURES: dict[str, Callable[[Any, str], tuple[str, agent.McpToolResult]]] = {
    "error": lambda v, label: (
        with_detail(f"The MCP tool {label} failed", v.error or "unknown error"),
        agent.McpToolResult(error=agent.McpToolError(error=v.error)),
    ),
    "rejected": lambda v, label: (
        with_detail(f"The user rejected the MCP tool call {label}", v.reason),
        agent.McpToolResult(rejected=v),
    ),
    "permission_denied": lambda v, label: (
        with_detail(f"Permission denied for the MCP tool {label}", v.error),
        agent.McpToolResult(permission_denied=v),
    ),
    "tool_not_found": lambda v, label: _as_error(_not_found("tool", v.name or label, v.available_tools)),
    "server_not_found": lambda v, label: _as_error(_not_found("server", v.name, v.available_servers)),
}


def _as_error(text: str) -> tuple[str, agent.McpToolResult]:
    return text, agent.McpToolResult(error=agent.McpToolError(error=text))


def call_card(args: agent.McpArgs, result: agent.McpToolResult | None = None) -> agent.ToolCall:
    return agent.ToolCall(mcp_tool_call=agent.McpToolCall(args=args, result=result))


def call_error(args: agent.McpArgs, message: str) -> ToolOutcome:
    result = agent.McpToolResult(error=agent.McpToolError(error=message))
    return ToolOutcome(message, True, call_card(args, result))


def call_outcome(args: agent.McpArgs, result: agent.McpResult, label: str) -> ToolOutcome:
    """``label`` names the tool for the model (``server/tool``, or a dynamic tool's name)."""
    kind, value = variant(result)
    if kind == "success":
        text = success_text(value)
        if value.is_error:
            text = f"The MCP tool {label} reported an error:\n{text}"
        return ToolOutcome(text, value.is_error, call_card(args, agent.McpToolResult(success=value)))
    if kind in _CALL_FAILURES:
        text, card = _CALL_FAILURES[kind](value, label)
        return ToolOutcome(text, True, call_card(args, card))
    if kind == "approved":  # byok never asks for an approval-only answer
        return call_error(args, "protocol error: the client answered an MCP call with an approval only")
    return call_error(args, no_variant("mcp_result"))


# --- FetchMcpResource ----------------------------------------------------------------------------------


def resource_card(
    args: agent.ReadMcpResourceExecArgs, result: agent.ReadMcpResourceExecResult | None = None
) -> agent.ToolCall:
    call = agent.ReadMcpResourceToolCall(args=args, result=result)
    return agent.ToolCall(read_mcp_resource_tool_call=call)


def resource_error(args: agent.ReadMcpResourceExecArgs, message: str) -> ToolOutcome:
    result = agent.ReadMcpResourceExecResult(error=agent.ReadMcpResourceError(uri=args.uri, error=message))
    return ToolOutcome(message, True, resource_card(args, result))


def _resource_text(args: agent.ReadMcpResourceExecArgs, s: agent.ReadMcpResourceSuccess) -> str:
    uri = s.uri or args.uri
    saved = s.download_path or args.download_path
    if saved:  # saved in the workspace and, as the tool says, not returned to the model
        return f"Saved the MCP resource {uri} to {saved}."
    kind, value = variant(s, "content")
    if kind == "text":
        return value
    mime = s.mime_type or "unknown type"
    if kind == "blob":
        return (
            f"The MCP resource {uri} is binary ({mime}, {len(value)} bytes): pass downloadPath to "
            "save it in the workspace."
        )
    return f"The MCP resource {uri} is empty."


def resource_outcome(
    args: agent.ReadMcpResourceExecArgs, result: agent.ReadMcpResourceExecResult
) -> ToolOutcome:
    kind, value = variant(result)
    uri = getattr(value, "uri", "") or args.uri
    if kind == "success":
        return ToolOutcome(_resource_text(args, value), False, resource_card(args, result))
    if kind == "error":
        text = with_detail(f"Cannot read the MCP resource {uri}", value.error or "unknown error")
    elif kind == "rejected":
        text = with_detail(f"Reading the MCP resource {uri} was rejected", value.reason)
    elif kind == "not_found":
        text = f"The MCP resource {uri} was not found on the server {args.server!r}."
    else:
        return resource_error(args, no_variant("read_mcp_resource_exec_result"))
    return ToolOutcome(text, True, resource_card(args, result))
