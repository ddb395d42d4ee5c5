"""Delete: one ``delete_args`` Exec, answered by one typed ``delete_result``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from byok.cursor.tools.base import Invocation, OneShot, ToolDef, ToolOutcome, require_str
from byok.cursor.tools.exec_results import no_variant, path_of, typed_one_shot, variant, with_detail
from byok.pb.agent import v1 as agent


def _parse_delete(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {"path": require_str(args, "path")}


def _delete_ui(args: Mapping[str, Any]) -> agent.DeleteToolCall:
    return agent.DeleteToolCall(args=agent.DeleteArgs(path=args["path"]))


def _execute_delete(inv: Invocation) -> OneShot:
    args = inv.args
    exec_message = agent.ExecServerMessage(
        delete_args=agent.DeleteArgs(path=args["path"], tool_call_id=inv.call_id)
    )
    return typed_one_shot(
        exec_message, "delete_result", lambda r: _delete_outcome(args, r), lambda e: _delete_error(args, e)
    )


def _delete_card(args: Mapping[str, Any], result: agent.DeleteResult) -> agent.ToolCall:
    return agent.ToolCall(delete_tool_call=agent.DeleteToolCall(args=_delete_ui(args).args, result=result))


def _delete_error(args: Mapping[str, Any], message: str) -> ToolOutcome:
    result = agent.DeleteResult(error=agent.DeleteError(path=args["path"], error=message))
    return ToolOutcome(message, True, _delete_card(args, result))


def _not_file(v: agent.DeleteNotFile, p: str) -> str:
    kind = f" (it is a {v.actual_type})" if v.actual_type else ""
    return f"Cannot delete {p}: not a regular file{kind}."


def _delete_denied(v: agent.DeletePermissionDenied, p: str) -> str:
    base = f"Cannot delete {p}: permission denied" + (" (the file is read-only)" if v.is_readonly else "")
    return with_detail(base, v.client_visible_error)


_DELETE_FAILURES: dict[str, Callable[[Any, str], str]] = {
    "file_not_found": lambda v, p: f"Cannot delete {p}: file not found.",
    "not_file": _not_file,
    "permission_denied": _delete_denied,
    "file_busy": lambda v, p: f"Cannot delete {p}: the file is in use by another process.",
    "rejected": lambda v, p: with_detail(f"Deleting {p} was rejected", v.reason),
    "error": lambda v, p: with_detail(f"Cannot delete {p}", v.error or "unknown error"),
}


def _delete_outcome(args: Mapping[str, Any], result: agent.DeleteResult) -> ToolOutcome:
    name, value = variant(result)
    path = path_of(value, args["path"])
    if name == "success":
        return ToolOutcome(f"Deleted {path}.", False, _delete_card(args, result))
    if name in _DELETE_FAILURES:
        return ToolOutcome(_DELETE_FAILURES[name](value, path), True, _delete_card(args, result))
    return _delete_error(args, no_variant("delete_result"))


DELETE = ToolDef(
    name="Delete",
    ui_field="delete_tool_call",
    placeholder=agent.DeleteToolCall,
    parse=_parse_delete,
    ui=_delete_ui,
    execute=_execute_delete,
)


TOOLS: tuple[ToolDef, ...] = (DELETE,)
