"""ReadLints: one ``diagnostics_args`` Exec, answered by one typed ``diagnostics_result``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from byok.cursor.tools.base import Invocation, OneShot, ToolDef, ToolOutcome, string_list
from byok.cursor.tools.exec_results import no_variant, path_of, typed_one_shot, variant, with_detail
from byok.pb.agent import v1 as agent


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
        where = path_of(value, target) or "the workspace"
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


TOOLS: tuple[ToolDef, ...] = (READ_LINTS,)
