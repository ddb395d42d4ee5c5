"""Read, Delete and ReadLints: one Exec each, answered by one typed client result.

Success or failure is decided only by which oneof variant the client set, never by looking at
text. Every outcome carries the model's string and the typed card (arguments + result).

The small helpers at the top (typed_one_shot, variant, ...) are shared with search_tools.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import betterproto2

from byok.cursor import encode
from byok.cursor.tools.base import (
    Invocation,
    OneShot,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_int,
    optional_str,
    require_str,
    string_list,
)
from byok.pb.agent import v1 as agent

_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1


# --- shared helpers ----------------------------------------------------------------------------


def typed_one_shot(
    exec_message: agent.ExecServerMessage,
    expected: str,
    on_value: Callable[[Any], ToolOutcome],
    on_failure: Callable[[str], ToolOutcome],
) -> OneShot:
    """A OneShot whose answer must be the ExecClientMessage variant ``expected``.

    Any other variant is a protocol error reported to the model; it is never interpreted.
    """

    def on_result(msg: agent.ExecClientMessage) -> ToolOutcome:
        field, value = betterproto2.which_one_of(msg, "message")
        if field != expected or value is None:
            return on_failure(f"protocol error: expected {expected}, got {field or 'an empty message'}")
        return on_value(value)

    return OneShot(exec_message, on_result, on_failure)


def variant(message: betterproto2.Message, group: str = "result") -> tuple[str, Any]:
    """(field name, value) of a oneof; ("", None) when the client set none."""
    return betterproto2.which_one_of(message, group)


def no_variant(result_field: str) -> str:
    return f"protocol error: {result_field} carries no result"


def with_detail(base: str, detail: str) -> str:
    return f"{base}: {detail}" if detail else f"{base}."


def int32_arg(args: Mapping[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    # The wire fields are int32: a larger value would fail only when the Exec is encoded.
    value = optional_int(args, key, minimum=minimum)
    if value is not None and abs(value) > _INT32_MAX:
        raise ToolArgError(f"argument '{key}' is out of range: {value}")
    return value


def optional_text(args: Mapping[str, Any], key: str) -> str | None:
    """An optional string where "" means "not given" (models often send empty strings for defaults)."""
    return optional_str(args, key) or None


def uint32(value: int) -> int:
    return max(0, min(value, _UINT32_MAX))


def _path_of(value: Any, fallback: str) -> str:
    return getattr(value, "path", "") or fallback


# --- Read --------------------------------------------------------------------------------------


def _parse_read(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "path": require_str(args, "path"),
        "offset": int32_arg(args, "offset"),
        "limit": int32_arg(args, "limit", minimum=1),
    }


def _read_args(args: Mapping[str, Any]) -> agent.ReadToolArgs:
    return agent.ReadToolArgs(path=args["path"], offset=args["offset"], limit=args["limit"])


def _read_ui(args: Mapping[str, Any]) -> agent.ReadToolCall:
    return agent.ReadToolCall(args=_read_args(args))


def _execute_read(inv: Invocation) -> OneShot:
    args = inv.args
    exec_message = agent.ExecServerMessage(
        read_args=agent.ReadArgs(
            path=args["path"], tool_call_id=inv.call_id, offset=args["offset"], limit=args["limit"]
        )
    )
    return typed_one_shot(
        exec_message, "read_result", lambda r: _read_outcome(args, r), lambda e: _read_error(args, e)
    )


def _read_card(args: Mapping[str, Any], result: agent.ReadToolResult) -> agent.ToolCall:
    return agent.ToolCall(read_tool_call=agent.ReadToolCall(args=_read_args(args), result=result))


def _read_error(args: Mapping[str, Any], message: str) -> ToolOutcome:
    result = agent.ReadToolResult(error=agent.ReadToolError(error_message=message))
    return ToolOutcome(message, True, _read_card(args, result))


_READ_FAILURES: dict[str, Callable[[Any, str], str]] = {
    "error": lambda v, p: with_detail(f"Cannot read {p}", v.error or "unknown error"),
    "rejected": lambda v, p: with_detail(f"Reading {p} was rejected", v.reason),
    "file_not_found": lambda v, p: f"Cannot read {p}: file not found.",
    "permission_denied": lambda v, p: f"Cannot read {p}: permission denied.",
    "invalid_file": lambda v, p: with_detail(f"Cannot read {p}", v.reason or "not a readable file"),
}


def _read_outcome(args: Mapping[str, Any], result: agent.ReadResult) -> ToolOutcome:
    name, value = variant(result)
    if name == "success":
        return _read_success(args, value)
    if name in _READ_FAILURES:
        return _read_error(args, _READ_FAILURES[name](value, _path_of(value, args["path"])))
    return _read_error(args, no_variant("read_result"))


def _read_success(args: Mapping[str, Any], s: agent.ReadSuccess) -> ToolOutcome:
    path = s.path or args["path"]
    kind, output = variant(s, "output")
    if kind == "data":
        size = s.file_size or len(output)
        content = f"{path} is a binary or image file ({size} bytes); its content cannot be shown as text."
        success = agent.ReadToolSuccess(data=output, path=path, file_size=uint32(size))
        return ToolOutcome(content, False, _read_card(args, agent.ReadToolResult(success=success)))
    if kind == "" and s.output_blob_id is not None:
        # The content lives in the client's blob store; a one-shot Exec has no way to fetch it.
        return _read_error(
            args,
            f"Cannot read {path}: the client returned the content by blob reference, which byok does not "
            "support; try reading a smaller range with offset and limit.",
        )
    lines = split_lines(output or "")
    total = max(s.total_lines, len(lines))
    start = _start_index(total, args["offset"])
    if s.range_applied:
        shown = lines
    else:
        end = len(lines) if args["limit"] is None else min(start + args["limit"], len(lines))
        shown = lines[start:end]
    first, last = start + 1, start + len(shown)
    content = _render_read(shown, first, last, total, args["offset"], truncated=s.truncated)
    windowed = bool(shown) and (first > 1 or last < total)
    success = agent.ReadToolSuccess(
        content="\n".join(shown),
        is_empty=total == 0,
        exceeded_limit=s.truncated,
        total_lines=uint32(total),
        file_size=uint32(s.file_size),
        path=path,
        read_range=agent.ReadRange(start_line=first, end_line=last) if windowed else None,
    )
    read_args = _read_args(args)
    card = agent.ToolCall(
        read_tool_call=agent.ReadToolCall(args=read_args, result=agent.ReadToolResult(success=success))
    )
    # The card holds the whole file: encode it once, by hand (see encode.read_card).
    return ToolOutcome(content, False, card).with_ui_bytes(encode.read_card(read_args, success))


def split_lines(text: str) -> list[str]:
    """Lines as an editor numbers them: only "\\n" breaks lines (str.splitlines would also split on
    form feeds and Unicode separators and shift every later number); a trailing "\\r" is dropped."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" not in text:  # the common case: no per-line pass over a large file
        return lines
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _start_index(total: int, offset: int | None) -> int:
    """0-based first line for a Read offset: positive is 1-based, negative counts from the end."""
    if not offset:
        return 0
    if offset > 0:
        return offset - 1
    return max(total + offset, 0)


def numbered(lines: Sequence[str], first: int) -> str:
    """``"\\n".join(f"{number:>6}|{line}")`` from ``first``, without formatting every line in
    Python: numbers of one digit count share one padding string, and one join builds the text."""
    n = len(lines)
    if n < 64 or first < 1:
        return "\n".join(f"{number:>6}|{line}" for number, line in enumerate(lines, start=first))
    last = first + n - 1
    pads: list[str] = []
    k = first
    while k <= last:  # one run per digit count: 1-9, 10-99, ...
        digits = len(str(k))
        end = min(last, 10**digits - 1)
        pads += ["\n" + " " * (6 - digits)] * (end - k + 1)
        k = end + 1
    pads[0] = pads[0][1:]
    parts: list[str] = [""] * (4 * n)
    parts[0::4] = pads
    parts[1::4] = map(str, range(first, last + 1))
    parts[2::4] = ["|"] * n
    parts[3::4] = lines
    return "".join(parts)


def _render_read(
    shown: Sequence[str], first: int, last: int, total: int, offset: int | None, *, truncated: bool
) -> str:
    if total == 0 and not shown:
        return "File is empty."
    if not shown:
        past = f"; offset {offset} is past its end" if offset else ""
        return f"No lines to show: the file has {total} lines{past}."
    notes = []
    if first > 1 or last < total:
        more = f" Continue with offset={last + 1}." if last < total else ""
        notes.append(f"Showing lines {first}-{last} of {total}.{more}")
    if truncated:
        notes.append("The client truncated the content; read the rest with offset and limit.")
    body = numbered(shown, first)
    return f"{body}\n\n[{' '.join(notes)}]" if notes else body


READ = ToolDef(
    name="Read",
    ui_field="read_tool_call",
    placeholder=agent.ReadToolCall,
    parse=_parse_read,
    ui=_read_ui,
    execute=_execute_read,
)


# --- Delete ------------------------------------------------------------------------------------


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
    path = _path_of(value, args["path"])
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


# --- ReadLints ---------------------------------------------------------------------------------


def _parse_read_lints(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {"paths": tuple(string_list(args, "paths"))}


def _read_lints_ui(args: Mapping[str, Any]) -> agent.ReadLintsToolCall:
    return agent.ReadLintsToolCall(args=agent.ReadLintsToolArgs(paths=list(args["paths"])))


def _execute_read_lints(inv: Invocation) -> OneShot:
    args = inv.args
    # The diagnostics Exec takes one path: the first requested one, or "" for the whole workspace.
    target = args["paths"][0] if args["paths"] else ""
    exec_message = agent.ExecServerMessage(
        diagnostics_args=agent.DiagnosticsArgs(path=target, tool_call_id=inv.call_id)
    )
    return typed_one_shot(
        exec_message,
        "diagnostics_result",
        lambda r: _read_lints_outcome(args, target, r),
        lambda e: _read_lints_error(args, e),
    )


def _read_lints_card(args: Mapping[str, Any], result: agent.ReadLintsToolResult) -> agent.ToolCall:
    call = agent.ReadLintsToolCall(args=_read_lints_ui(args).args, result=result)
    return agent.ToolCall(read_lints_tool_call=call)


def _read_lints_error(args: Mapping[str, Any], message: str) -> ToolOutcome:
    result = agent.ReadLintsToolResult(error=agent.ReadLintsToolError(error_message=message))
    return ToolOutcome(message, True, _read_lints_card(args, result))


_LINT_FAILURES: dict[str, Callable[[Any, str], str]] = {
    "error": lambda v, p: with_detail(f"Cannot read diagnostics for {p}", v.error or "unknown error"),
    "rejected": lambda v, p: with_detail(f"Reading diagnostics for {p} was rejected", v.reason),
    "file_not_found": lambda v, p: f"Cannot read diagnostics for {p}: file not found.",
    "permission_denied": lambda v, p: f"Cannot read diagnostics for {p}: permission denied.",
}

_SEVERITY = {
    agent.DiagnosticSeverity.ERROR: "error",
    agent.DiagnosticSeverity.WARNING: "warning",
    agent.DiagnosticSeverity.INFORMATION: "info",
    agent.DiagnosticSeverity.HINT: "hint",
}


def _read_lints_outcome(args: Mapping[str, Any], target: str, result: agent.DiagnosticsResult) -> ToolOutcome:
    name, value = variant(result)
    if name == "success":
        return _read_lints_success(args, target, value)
    if name in _LINT_FAILURES:
        where = _path_of(value, target) or "the workspace"
        return _read_lints_error(args, _LINT_FAILURES[name](value, where))
    return _read_lints_error(args, no_variant("diagnostics_result"))


def _read_lints_success(args: Mapping[str, Any], target: str, s: agent.DiagnosticsSuccess) -> ToolOutcome:
    path = s.path or target
    diagnostics = list(s.diagnostics)
    total = max(s.total_diagnostics, len(diagnostics))
    if diagnostics:
        lines = [f"{path or 'Workspace'}: {total} diagnostic{'s' if total != 1 else ''}"]
        lines += [_diagnostic_line(d) for d in diagnostics]
        if total > len(diagnostics):
            lines.append(f"[Showing {len(diagnostics)} of {total} diagnostics.]")
        content = "\n".join(lines)
    else:
        content = f"No linter errors found in {path}." if path else "No linter errors found."
    skipped = args["paths"][1:]
    if skipped:
        content += f"\n\n[Only {target} was checked; call ReadLints again for: {', '.join(skipped)}.]"
    items = [
        agent.DiagnosticItem(
            severity=d.severity,
            range=agent.DiagnosticRange(start=d.range.start, end=d.range.end) if d.range else None,
            message=d.message,
            source=d.source,
            code=d.code,
            is_stale=d.is_stale,
        )
        for d in diagnostics
    ]
    files = [agent.FileDiagnostics(path=path, diagnostics=items, diagnostics_count=total)] if items else []
    success = agent.ReadLintsToolSuccess(
        file_diagnostics=files, total_files=len(files), total_diagnostics=total
    )
    return ToolOutcome(content, False, _read_lints_card(args, agent.ReadLintsToolResult(success=success)))


def _diagnostic_line(d: agent.Diagnostic) -> str:
    start = d.range.start if d.range else None
    where = f"{start.line}:{start.column}" if start else "?:?"
    origin = " ".join(part for part in (d.source, d.code) if part)
    suffix = (f" ({origin})" if origin else "") + (" [stale]" if d.is_stale else "")
    # Multi-line messages stay under their diagnostic instead of looking like new entries.
    message = d.message.strip().replace("\n", "\n    ")
    return f"  {where} {_SEVERITY.get(d.severity, 'issue')}: {message}{suffix}"


READ_LINTS = ToolDef(
    name="ReadLints",
    ui_field="read_lints_tool_call",
    placeholder=agent.ReadLintsToolCall,
    parse=_parse_read_lints,
    ui=_read_lints_ui,
    execute=_execute_read_lints,
)


TOOLS: tuple[ToolDef, ...] = (READ, DELETE, READ_LINTS)
