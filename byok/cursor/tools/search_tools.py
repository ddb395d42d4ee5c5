"""Grep and Glob: both run as one Exec ``grep_args`` and are answered by one ``grep_result``.

Glob has no Exec of its own: Cursor lists files by a ripgrep search with an empty pattern, the
glob as file filter and ``files_with_matches`` output (PROTOCOL §4).

A GrepSuccess holds one result per workspace root (a map, kept in the order the client sent it),
each a oneof of content / files / count. The model's text is chosen by that typed variant, not by
the output_mode that was asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from byok.cursor.tools.base import (
    Invocation,
    OneShot,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    int32_arg,
    optional_bool,
    optional_text,
    require_str,
)
from byok.cursor.tools.exec_results import no_variant, typed_one_shot, variant, with_detail
from byok.pb.agent import v1 as agent

OUTPUT_MODES = ("content", "files_with_matches", "count")

# Model argument name -> GrepArgs field, for the ones whose names differ (PROTOCOL §4).
_INT_ARGS = {
    "-A": "context_after",
    "-B": "context_before",
    "-C": "context",
    "head_limit": "head_limit",
    "offset": "offset",
}


def _sections(success: agent.GrepSuccess) -> list[tuple[str, agent.GrepUnionResult]]:
    """(workspace root, result) pairs. The active-editor result is used only when there is no
    workspace result, since it would otherwise repeat matches already listed."""
    sections = list(success.workspace_results.items())
    if not sections and success.active_editor_result is not None:
        sections = [("", success.active_editor_result)]
    return sections


def _limit_notes(result: Any, shown: int) -> list[str]:
    notes = []
    if result.client_truncated or result.ripgrep_truncated:
        notes.append("Results were truncated; narrow the search or page with head_limit and offset.")
    limit = result.head_limit_applied
    if limit and shown >= limit:
        notes.append(
            f"Output limited to {limit} entries; use offset={(result.offset_applied or 0) + limit} for more."
        )
    return notes


def _union_lines(union: agent.GrepUnionResult) -> tuple[list[str], int, list[str]]:
    """(lines, entry count, notes) for one result; entries are what head_limit counts."""
    kind, result = variant(union)
    lines: list[str] = []
    if kind == "content":
        entries = 0
        for file_match in result.matches:
            for m in file_match.matches:
                sep = "-" if m.is_context_line else ":"
                entries += not m.is_context_line
                text = m.content.rstrip("\r\n") + (" [line truncated]" if m.content_truncated else "")
                lines.append(f"{file_match.file}{sep}{m.line_number}{sep}{text}")
    elif kind == "files":
        lines = list(result.files)
        entries = len(lines)
    elif kind == "count":
        lines = [f"{c.file}:{c.count}" for c in result.counts]
        entries = len(lines)
    else:
        return [], 0, []
    return lines, entries, _limit_notes(result, entries)


def format_grep(success: agent.GrepSuccess, *, pattern: str, path: str | None) -> str:
    sections = [(root, *_union_lines(union)) for root, union in _sections(success)]
    sections = [s for s in sections if s[1]]
    if not sections:
        where = f" in {path}" if path else ""
        return f'No matches found for pattern "{pattern}"{where}.'
    blocks = []
    for root, lines, _entries, _notes in sections:
        # Paths may be relative to their workspace root; with several roots, say which is which.
        header = [f"Results in {root}:"] if len(sections) > 1 and root else []
        blocks.append("\n".join(header + lines))
    notes = _unique(note for *_, section_notes in sections for note in section_notes)
    text = "\n\n".join(blocks)
    return f"{text}\n\n[{' '.join(notes)}]" if notes else text


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# --- Grep --------------------------------------------------------------------------------------


def _parse_grep(args: Mapping[str, Any]) -> Mapping[str, Any]:
    mode = optional_text(args, "output_mode")
    if mode is not None and mode not in OUTPUT_MODES:
        raise ToolArgError(f"argument 'output_mode' must be one of {', '.join(OUTPUT_MODES)}, got {mode!r}")
    return {
        "pattern": require_str(args, "pattern"),
        "path": optional_text(args, "path"),
        "glob": optional_text(args, "glob"),
        "type": optional_text(args, "type"),
        "output_mode": mode,
        **{key: int32_arg(args, key, minimum=0) for key in _INT_ARGS},
        "-i": optional_bool(args, "-i"),
        "multiline": optional_bool(args, "multiline"),
    }


def _grep_args(args: Mapping[str, Any], tool_call_id: str = "") -> agent.GrepArgs:
    return agent.GrepArgs(
        pattern=args["pattern"],
        path=args["path"],
        glob=args["glob"],
        output_mode=args["output_mode"],
        case_insensitive=args["-i"],
        type=args["type"],
        multiline=args["multiline"],
        tool_call_id=tool_call_id,
        **{field: args[key] for key, field in _INT_ARGS.items()},
    )


def _grep_ui(args: Mapping[str, Any]) -> agent.GrepToolCall:
    return agent.GrepToolCall(args=_grep_args(args))


def _execute_grep(inv: Invocation) -> OneShot:
    args = inv.args
    exec_message = agent.ExecServerMessage(grep_args=_grep_args(args, inv.call_id))
    return typed_one_shot(
        exec_message, "grep_result", lambda r: _grep_outcome(args, r), lambda e: _grep_error(args, e)
    )


def _grep_card(args: Mapping[str, Any], result: agent.GrepResult) -> agent.ToolCall:
    return agent.ToolCall(grep_tool_call=agent.GrepToolCall(args=_grep_args(args), result=result))


def _grep_error(args: Mapping[str, Any], message: str) -> ToolOutcome:
    return ToolOutcome(
        message, True, _grep_card(args, agent.GrepResult(error=agent.GrepError(error=message)))
    )


def _grep_outcome(args: Mapping[str, Any], result: agent.GrepResult) -> ToolOutcome:
    name, value = variant(result)
    if name == "success":
        content = format_grep(value, pattern=args["pattern"], path=args["path"])
        return ToolOutcome(content, False, _grep_card(args, result))
    if name == "error":
        return ToolOutcome(with_detail("Search failed", value.error), True, _grep_card(args, result))
    return _grep_error(args, no_variant("grep_result"))


GREP = ToolDef(
    name="Grep",
    ui_field="grep_tool_call",
    placeholder=agent.GrepToolCall,
    parse=_parse_grep,
    ui=_grep_ui,
    execute=_execute_grep,
)


# --- Glob --------------------------------------------------------------------------------------


def _parse_glob(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "glob_pattern": require_str(args, "glob_pattern"),
        "target_directory": optional_text(args, "target_directory"),
    }


def _glob_args(args: Mapping[str, Any]) -> agent.GlobToolArgs:
    return agent.GlobToolArgs(target_directory=args["target_directory"], glob_pattern=args["glob_pattern"])


def _glob_ui(args: Mapping[str, Any]) -> agent.GlobToolCall:
    return agent.GlobToolCall(args=_glob_args(args))


def _execute_glob(inv: Invocation) -> OneShot:
    args = inv.args
    exec_message = agent.ExecServerMessage(
        grep_args=agent.GrepArgs(
            pattern="",
            glob=args["glob_pattern"],
            path=args["target_directory"],
            output_mode="files_with_matches",
            tool_call_id=inv.call_id,
        )
    )
    return typed_one_shot(
        exec_message, "grep_result", lambda r: _glob_outcome(args, r), lambda e: _glob_error(args, e)
    )


def _glob_card(args: Mapping[str, Any], result: agent.GlobToolResult) -> agent.ToolCall:
    return agent.ToolCall(glob_tool_call=agent.GlobToolCall(args=_glob_args(args), result=result))


def _glob_error(args: Mapping[str, Any], message: str) -> ToolOutcome:
    return ToolOutcome(
        message, True, _glob_card(args, agent.GlobToolResult(error=agent.GlobToolError(error=message)))
    )


def _glob_outcome(args: Mapping[str, Any], result: agent.GrepResult) -> ToolOutcome:
    name, value = variant(result)
    if name == "success":
        return _glob_success(args, value)
    if name == "error":
        return _glob_error(args, with_detail("File search failed", value.error))
    return _glob_error(args, no_variant("grep_result"))


def _union_files(union: agent.GrepUnionResult) -> tuple[list[str], Any]:
    # Asked for files_with_matches, but take file names from whichever variant the client sent.
    kind, result = variant(union)
    if kind == "files":
        return list(result.files), result
    if kind == "count":
        return [c.file for c in result.counts], result
    if kind == "content":
        return [m.file for m in result.matches], result
    return [], None


def _glob_success(args: Mapping[str, Any], success: agent.GrepSuccess) -> ToolOutcome:
    files: list[str] = []
    notes: list[str] = []
    total = 0
    client_truncated = ripgrep_truncated = False
    for _root, union in _sections(success):
        found, result = _union_files(union)
        if result is None:
            continue
        files += found
        total += max(getattr(result, "total_files", 0), len(found))
        client_truncated |= result.client_truncated
        ripgrep_truncated |= result.ripgrep_truncated
        notes += _limit_notes(result, len(found))
    files = _unique(files)
    pattern, directory = args["glob_pattern"], args["target_directory"]
    if files:
        if total > len(files) and not notes:
            notes.append(f"Showing {len(files)} of {total} files; use a more specific pattern.")
        notes = _unique(notes)
        content = "\n".join(files) + (f"\n\n[{' '.join(notes)}]" if notes else "")
    else:
        content = f'No files found matching "{pattern}"' + (f" in {directory}" if directory else "") + "."
    ui = agent.GlobToolSuccess(
        pattern=pattern,
        path=directory or success.path,
        files=files,
        total_files=total,
        client_truncated=client_truncated,
        ripgrep_truncated=ripgrep_truncated,
    )
    return ToolOutcome(content, False, _glob_card(args, agent.GlobToolResult(success=ui)))


GLOB = ToolDef(
    name="Glob",
    ui_field="glob_tool_call",
    placeholder=agent.GlobToolCall,
    parse=_parse_glob,
    ui=_glob_ui,
    execute=_execute_glob,
)


TOOLS: tuple[ToolDef, ...] = (GREP, GLOB)
