"""Cards for calls that end in an error before any tool runs (sans-IO).

Every tool call the model makes gets a placeholder, a started card and a completed card with a
typed result, whether byok runs it or not. A call refused as not offered in the mode, or whose
arguments do not parse, keeps its own tool's card with that card's error variant. A tool byok
does not know has no card of its own: it is drawn as a generic named tool with its arguments
(``mcp_tool_call``, whose ``McpArgs`` carry a name and free-form JSON arguments; the reference
server draws unsupported tools the same way), under the provider name ``byok``.
"""

from __future__ import annotations

import functools
import json
import typing
from collections.abc import Mapping
from typing import Any

import betterproto2

from byok.pb.agent import v1 as agent
from byok.pb.google.protobuf import Value

UNKNOWN_PROVIDER = "byok"  # McpArgs.provider_identifier of a tool byok does not know

# The text fields an error variant holds its message in, by the names the proto uses.
_MESSAGE_FIELDS = ("error", "error_message", "model_visible_error")


def unknown_tool_call(name: str, call_id: str = "", arguments: str = "") -> agent.ToolCall:
    """The card of a tool byok does not know, with the model's arguments when they are a JSON
    object (the placeholder while the model writes them has none)."""
    args: dict[str, Value] = {}
    if arguments:
        try:
            obj = json.loads(arguments)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            args = {str(k): Value.from_dict(v) for k, v in obj.items()}
    mcp_args = agent.McpArgs(
        name=name, args=args, tool_call_id=call_id, provider_identifier=UNKNOWN_PROVIDER, tool_name=name
    )
    return agent.ToolCall(mcp_tool_call=agent.McpToolCall(args=mcp_args))


def unknown_tool_error(name: str, call_id: str, arguments: str, message: str) -> agent.ToolCall:
    card = unknown_tool_call(name, call_id, arguments)
    assert card.mcp_tool_call is not None
    card.mcp_tool_call.result = agent.McpToolResult(error=agent.McpToolError(error=message))
    return card


def with_error(card: agent.ToolCall, message: str) -> agent.ToolCall:
    """``card`` (one tool's record, arguments set or not) completed with its error variant
    carrying ``message``. Every card type in the proto has one (Shell's is ``spawn_error``);
    a record without one keeps its arguments and no result."""
    field, record = betterproto2.which_one_of(card, "tool")
    if record is None:
        return card
    shape = _error_shape(type(record))
    if shape is None:
        return card
    result_cls, variant, error_cls, text_fields = shape
    error = error_cls(**{f: message for f in text_fields})
    path = _path_of(record)
    if path and "path" in _fields(error_cls):
        error.path = path
    record.result = result_cls(**{variant: error})
    return agent.ToolCall(**{field: record})


def _path_of(record: Any) -> str:
    args = getattr(record, "args", None)
    return getattr(args, "path", "") if isinstance(getattr(args, "path", None), str) else ""


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap(hint: Any) -> Any:
    inner = [a for a in typing.get_args(hint) if a is not type(None)]
    return inner[0] if inner else hint


@functools.cache
def _error_shape(record_cls: type) -> tuple[type, str, type, tuple[str, ...]] | None:
    """(result class, its error variant, the variant's class, its message fields) of a card."""
    result_hint = _fields(record_cls).get("result")
    if result_hint is None:
        return None
    result_cls = _unwrap(result_hint)
    for variant in ("error", "spawn_error"):
        hint = _fields(result_cls).get(variant)
        if hint is None:
            continue
        error_cls = _unwrap(hint)
        text = tuple(f for f in _MESSAGE_FIELDS if _fields(error_cls).get(f) is str)
        if text:
            return result_cls, variant, error_cls, text
    return None


def error_card_for(
    known: Mapping[str, Any], name: str, call_id: str, arguments: str, message: str, record: Any = None
) -> agent.ToolCall:
    """The completed error card of a call: its tool's own card (``record``, its arguments when
    they parsed, else the placeholder), or the generic one for a tool byok does not know."""
    tool = known.get(name)
    if tool is None:
        return unknown_tool_error(name, call_id, arguments, message)
    return with_error(tool.tool_call(record if record is not None else tool.placeholder()), message)
