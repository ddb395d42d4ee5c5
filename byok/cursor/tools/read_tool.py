"""Read: one ``read_args`` Exec, answered by one typed ``read_result``.

The model sees the lines numbered as an editor numbers them; the card holds the whole read. An
image file comes back as its bytes: a model with vision gets the image itself (its type sniffed
from the bytes), any other a line saying what the file is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from byok.cursor import encode
from byok.cursor.tools.base import Invocation, OneShot, ToolDef, ToolOutcome, int32_arg, require_str
from byok.cursor.tools.exec_results import no_variant, path_of, typed_one_shot, uint32, variant, with_detail
from byok.model.images import ImagePart, sniff_image_type
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
    vision = inv.env is None or inv.env.vision
    return typed_one_shot(
        exec_message, "read_result", lambda r: _read_outcome(args, r, vision), lambda e: _read_error(args, e)
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


def _read_outcome(args: Mapping[str, Any], result: agent.ReadResult, vision: bool = True) -> ToolOutcome:
    name, value = variant(result)
    if name == "success":
        return _read_success(args, value, vision)
    if name in _READ_FAILURES:
        return _read_error(args, _READ_FAILURES[name](value, path_of(value, args["path"])))
    return _read_error(args, no_variant("read_result"))


def _read_success(args: Mapping[str, Any], s: agent.ReadSuccess, vision: bool = True) -> ToolOutcome:
    path = s.path or args["path"]
    kind, output = variant(s, "output")
    if kind == "data":
        size = s.file_size or len(output)
        success = agent.ReadToolSuccess(data=output, path=path, file_size=uint32(size))
        card = _read_card(args, agent.ReadToolResult(success=success))
        media_type = sniff_image_type(output)
        if media_type is None:
            content = f"{path} is a binary file ({size} bytes); its content cannot be shown as text."
            return ToolOutcome(content, False, card)
        if not vision:
            content = (
                f"{path} is an image ({media_type}, {size} bytes); this model is configured without "
                "vision (vision = false), so it cannot be shown."
            )
            return ToolOutcome(content, False, card)
        content = f"{path} is an image ({media_type}, {size} bytes); here it is."
        return ToolOutcome(content, False, card, images=(ImagePart.of(output),))
    if kind == "" and s.output_blob_id is not None:
        # The content lives in the client's blob store; a one-shot Exec has no way to fetch it.
        return _read_error(
            args,
            f"Cannot read {path}: the client returned the content by blob reference, which byok does not "
            "support; try reading a smaller range with offset and limit.",
        )
    shown = _shown(output or "", s, args["offset"], args["limit"])
    total = max(s.total_lines, shown.held)
    first, last = shown.first, shown.last
    content = _render_read(shown, total, args["offset"], truncated=s.truncated)
    windowed = shown.count > 0 and (first > 1 or last < total)
    success = agent.ReadToolSuccess(
        content=shown.text,
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


@attrs.frozen
class _Shown:
    """The lines a Read shows: ``text`` is them joined by "\\n" (the card's content), ``numbered``
    what the model sees. ``held``: how many lines the client's output holds."""

    text: str
    numbered: str
    start: int  # 0-based index of the first line shown
    count: int
    held: int

    @property
    def first(self) -> int:
        return self.start + 1

    @property
    def last(self) -> int:
        return self.start + self.count


def _shown(output: str, s: agent.ReadSuccess, offset: int | None, limit: int | None) -> _Shown:
    if (s.range_applied or (not offset and limit is None)) and (offset or 0) >= 0:
        # Every line is shown, and where numbering starts does not depend on how many there are.
        return _every_line(output, _start_index(0, offset))
    lines = split_lines(output)
    start = _start_index(max(s.total_lines, len(lines)), offset)
    if s.range_applied:
        shown = lines
    else:
        end = len(lines) if limit is None else min(start + limit, len(lines))
        shown = lines[start:end]
    return _Shown("\n".join(shown), numbered(shown, start + 1), start, len(shown), len(lines))


def _every_line(output: str, start: int) -> _Shown:
    """Every line of ``output``, numbered from ``start + 1``, with no list of all its lines."""
    if not output:
        return _Shown("", "", start, 0, 0)
    text = joined_lines(output)
    body, count = numbered_text(text, start + 1)
    return _Shown(text, body, start, count, count)


def split_lines(text: str) -> list[str]:
    """Lines as an editor numbers them: only "\\n" breaks lines (str.splitlines would also split on
    form feeds and Unicode separators and shift every later number); a trailing "\\r" is dropped."""
    if not text:
        return []
    if "\r" in text:  # one replace over the whole text, not a pass over every line
        return joined_lines(text).split("\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def joined_lines(text: str) -> str:
    """``"\\n".join(split_lines(text))`` of a non-empty text, computed on the whole text."""
    text = text.removesuffix("\n")
    if "\r" in text:  # a memchr: LF-only text, the common case, takes no other pass
        text = text.replace("\r\n", "\n").removesuffix("\r")
    return text


def _start_index(total: int, offset: int | None) -> int:
    """0-based first line for a Read offset: positive is 1-based, negative counts from the end."""
    if not offset:
        return 0
    if offset > 0:
        return offset - 1
    return max(total + offset, 0)


# A large text is split and numbered this many characters at a time: one chunk's line strings are
# freed before the next chunk is split, so pymalloc reuses their memory rather than faulting in
# fresh arenas (~2.5 us a 4 KiB page) for every line of the file.
_CHUNK = 128 * 1024


def numbered_text(text: str, first: int) -> tuple[str, int]:
    """``numbered(text.split("\\n"), first)`` and how many lines that is."""
    parts: list[str] = []
    count = 0
    start = 0
    while True:
        stop = text.find("\n", start + _CHUNK)
        lines = text[start : len(text) if stop < 0 else stop].split("\n")
        parts.append(numbered(lines, first + count))
        count += len(lines)
        if stop < 0:
            return "\n".join(parts), count
        start = stop + 1


# A line's number is "\\n" and its digits but the last two, padded (one string for a hundred
# lines), then its last two digits and "|" (one of these hundred strings): no string per line.
_LAST_TWO = tuple(f"{k:02}|" for k in range(100))
_ONE_DIGIT = tuple(f" {k}|" for k in range(10))  # 1-9 are padded, not zero-filled


def numbered(lines: Sequence[str], first: int) -> str:
    """``"\\n".join(f"{number:>6}|{line}")`` from ``first``, joined from shared pieces (above)."""
    n = len(lines)
    if n < 10 or first < 1:  # (below ten lines formatting each is as fast)
        return "\n".join(f"{number:>6}|{line}" for number, line in enumerate(lines, start=first))
    skip = first % 100
    heads: list[str] = []
    for hundreds in range(first // 100, (first + n - 1) // 100 + 1):
        heads += [f"\n{hundreds or '':>4}"] * 100
    parts: list[str] = [""] * (3 * n)
    parts[0::3] = heads[skip : skip + n]
    parts[1::3] = (_LAST_TWO * ((skip + n) // 100 + 1))[skip : skip + n]
    parts[2::3] = lines
    if first < 10:
        parts[1 : 3 * (10 - first) : 3] = _ONE_DIGIT[first:]
    parts[0] = parts[0][1:]
    return "".join(parts)


def _render_read(shown: _Shown, total: int, offset: int | None, *, truncated: bool) -> str:
    if total == 0 and not shown.count:
        return "File is empty."
    if not shown.count:
        past = f"; offset {offset} is past its end" if offset else ""
        return f"No lines to show: the file has {total} lines{past}."
    notes = []
    first, last = shown.first, shown.last
    if first > 1 or last < total:
        more = f" Continue with offset={last + 1}." if last < total else ""
        notes.append(f"Showing lines {first}-{last} of {total}.{more}")
    if truncated:
        notes.append("The client truncated the content; read the rest with offset and limit.")
    return f"{shown.numbered}\n\n[{' '.join(notes)}]" if notes else shown.numbered


READ = ToolDef(
    name="Read",
    ui_field="read_tool_call",
    placeholder=agent.ReadToolCall,
    parse=_parse_read,
    ui=_read_ui,
    execute=_execute_read,
)


TOOLS: tuple[ToolDef, ...] = (READ,)
