"""Read: one ``read_args`` Exec, answered by one typed ``read_result``.

The model sees the lines numbered as an editor numbers them; the card holds the whole read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from byok.cursor import encode
from byok.cursor.tools.base import Invocation, OneShot, ToolDef, ToolOutcome, int32_arg, require_str
from byok.cursor.tools.exec_results import no_variant, path_of, typed_one_shot, uint32, variant, with_detail
from byok.pb.agent import v1 as agent


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
        return _read_error(args, _READ_FAILURES[name](value, path_of(value, args["path"])))
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


TOOLS: tuple[ToolDef, ...] = (READ,)
