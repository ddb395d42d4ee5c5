"""Write and StrReplace: a hidden read, the edit computed here, then a write.

Both tools draw Cursor's ``edit_tool_call`` card and use one transport: ``read_args`` for the
content before (the model never sees this read), then ``write_args`` with the whole new text.
The replacement for StrReplace runs in byok, never on the client, so the card's diff and the
model's result come from the same before/after pair. All text is LF-normalised (see
``text_edit``): a CRLF file is written back with LF endings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import betterproto2

from byok.cursor.tools.base import (
    Action,
    Finish,
    Invocation,
    SendExec,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_bool,
    require_str,
)
from byok.cursor.tools.json_stream import JsonStringField
from byok.cursor.tools.text_edit import (
    EditError,
    NewlineNormalizer,
    normalize_newlines,
    replace_unique,
    unified_diff,
)
from byok.pb.agent import v1 as agent

# The model needs to see what changed, not a second copy of a huge rewrite.
MODEL_DIFF_LIMIT = 8_000


class ContentStream:
    """ArgsStream: the streamed value of one argument, decoded and LF-normalised, as edit deltas."""

    def __init__(self, key: str) -> None:
        self._field = JsonStringField(key)
        self._newlines = NewlineNormalizer()
        self._flushed = False

    def feed(self, delta: str) -> list[agent.ToolCallDelta]:
        text = self._newlines.feed(self._field.feed(delta))
        if self._field.done and not self._flushed:
            # The value is complete: a CR held back at its very end is a line ending.
            self._flushed = True
            text += self._newlines.flush()
        if not text:
            return []
        return [agent.ToolCallDelta(edit_tool_call_delta=agent.EditToolCallDelta(stream_content_delta=text))]


def _edit_args(args: Mapping[str, Any], content_key: str) -> agent.EditArgs:
    # stream_content is the full text the deltas add up to (the LF-normalised argument).
    return agent.EditArgs(path=args["path"], stream_content=args[content_key])


def _capped_diff(diff: str) -> str:
    if len(diff) <= MODEL_DIFF_LIMIT:
        return diff
    cut = len(diff) - MODEL_DIFF_LIMIT
    return f"{diff[:MODEL_DIFF_LIMIT]}\n... (diff truncated: {cut} more characters)\n"


# Builds the new text from the text before (None: the file does not exist) or raises EditError.
Apply = Callable[[str | None], str]
# Builds the model's headline from (before, after, lines added, lines removed).
Describe = Callable[[str | None, str, int, int], str]


class EditExecution:
    """read_args -> (compute) -> write_args -> Finish. Results belong to the current phase's exec."""

    def __init__(self, inv: Invocation, edit_args: agent.EditArgs, apply: Apply, describe: Describe) -> None:
        self._inv = inv
        self._path: str = inv.args["path"]
        self._edit_args = edit_args
        self._apply = apply
        self._describe = describe
        self._phase = "read"  # "read" -> "write" -> "done"
        self._before: str | None = None
        self._after = ""

    def start(self) -> list[Action]:
        read = agent.ReadArgs(path=self._path, tool_call_id=self._inv.call_id)
        return [SendExec(agent.ExecServerMessage(read_args=read))]

    def on_result(self, msg: agent.ExecClientMessage) -> list[Action]:
        if self._phase == "done":
            return []
        field, value = betterproto2.which_one_of(msg, "message")
        expected = "read_result" if self._phase == "read" else "write_result"
        if field != expected:
            got = field or "an empty message"
            return self._fail(f"protocol error: expected {expected}, got {got}")
        if self._phase == "read":
            return self._on_read(value)
        return self._on_write(value)

    def on_stream_close(self) -> list[Action]:
        # After the terminal result the close is the normal tail. The read's own close never
        # arrives during the write phase: the run layer retires the read's exec id when the write
        # goes out, so a close seen now belongs to the exec still waiting for its result.
        if self._phase == "done":
            return []
        return self._fail("the client closed the tool stream before sending a result")

    def on_throw(self, error: str) -> list[Action]:
        if self._phase == "done":
            return []
        message = error or "the client failed to run the tool"
        return self._fail(message)

    # --- phases ----------------------------------------------------------------------------

    def _on_read(self, result: agent.ReadResult) -> list[Action]:
        path = self._path
        kind, value = betterproto2.which_one_of(result, "result")
        if kind == "success":
            if value.content is None:
                return self._fail(f"cannot edit {path}: it is not a text file")
            if value.truncated:
                # Writing back a partial read would destroy the rest of the file.
                why = "the client returned only part of the file"
                return self._fail(f"cannot edit {path}: {why}")
            self._before = normalize_newlines(value.content)
        elif kind == "file_not_found":
            self._before = None
        elif kind == "permission_denied":
            ui = agent.EditResult(read_permission_denied=agent.EditReadPermissionDenied(path=path))
            return self._fail(f"permission denied reading {path}", ui)
        elif kind == "rejected":
            ui = agent.EditResult(rejected=agent.EditRejected(path=path, reason=value.reason))
            return self._fail(_rejected_text("reading", path, value.reason), ui)
        elif kind in ("error", "invalid_file"):
            detail = value.error if kind == "error" else value.reason
            return self._fail(f"cannot read {path}: {detail}")
        else:
            return self._fail("protocol error: read_result has no result")
        try:
            self._after = self._apply(self._before)
        except EditError as e:
            missing = agent.EditResult(file_not_found=agent.EditFileNotFound(path=path))
            return self._fail(str(e), missing if self._before is None else None)
        self._phase = "write"
        write = agent.WriteArgs(
            path=path,
            file_text=self._after,
            tool_call_id=self._inv.call_id,
            return_file_content_after_write=False,
        )
        return [SendExec(agent.ExecServerMessage(write_args=write))]

    def _on_write(self, result: agent.WriteResult) -> list[Action]:
        path = self._path
        kind, value = betterproto2.which_one_of(result, "result")
        if kind == "success":
            return self._succeed()
        if kind == "permission_denied":
            ui = agent.EditResult(
                write_permission_denied=agent.EditWritePermissionDenied(
                    path=path, error=value.error, is_readonly=value.is_readonly
                )
            )
            detail = f": {value.error}" if value.error else ""
            return self._fail(f"permission denied writing {path}{detail}", ui)
        if kind == "no_space":
            return self._fail(f"no space left on device writing {path}")
        if kind == "rejected":
            ui = agent.EditResult(rejected=agent.EditRejected(path=path, reason=value.reason))
            return self._fail(_rejected_text("writing", path, value.reason), ui)
        if kind == "error":
            return self._fail(f"cannot write {path}: {value.error}")
        return self._fail("protocol error: write_result has no result")

    # --- outcomes --------------------------------------------------------------------------

    def _succeed(self) -> list[Action]:
        self._phase = "done"
        path, before, after = self._path, self._before, self._after
        diff, added, removed = unified_diff(path, before, after)
        headline = self._describe(before, after, added, removed)
        # A new file's diff is the text the model just wrote; only edits are worth echoing.
        content = headline if before is None or not diff else f"{headline}\n\n{_capped_diff(diff)}"
        success = agent.EditSuccess(
            path=path,
            lines_added=added,
            lines_removed=removed,
            diff_string=diff,
            # Absent exactly when the file is new: that is how the card tells "created" from "edited".
            before_full_file_content=before,
            after_full_file_content=after,
        )
        ui = agent.EditToolCall(args=self._edit_args, result=agent.EditResult(success=success))
        return [Finish(ToolOutcome(content=content, is_error=False, ui=agent.ToolCall(edit_tool_call=ui)))]

    def _fail(self, message: str, result: agent.EditResult | None = None) -> list[Action]:
        """A terminal error; without a more specific typed variant the card shows EditError."""
        self._phase = "done"
        if result is None:
            error = agent.EditError(path=self._path, error=message, model_visible_error=message)
            result = agent.EditResult(error=error)
        ui = agent.EditToolCall(args=self._edit_args, result=result)
        outcome = ToolOutcome(
            content=f"Error: {message}", is_error=True, ui=agent.ToolCall(edit_tool_call=ui)
        )
        return [Finish(outcome)]


def _rejected_text(doing: str, path: str, reason: str) -> str:
    why = f": {reason}" if reason else ""
    return f"the user rejected {doing} {path}{why}"


def _lines(text: str) -> int:
    return len(text.splitlines())


# --- Write -----------------------------------------------------------------------------------


def _parse_write(args: Mapping[str, Any]) -> Mapping[str, Any]:
    path = require_str(args, "path")
    contents = require_str(args, "contents", allow_empty=True)
    return {"path": path, "contents": normalize_newlines(contents)}


def _execute_write(inv: Invocation) -> EditExecution:
    contents: str = inv.args["contents"]
    path: str = inv.args["path"]

    def describe(before: str | None, after: str, added: int, removed: int) -> str:
        if before is None:
            return f"Created {path} ({_lines(after)} lines)."
        if before == after:
            return f"Wrote {_lines(after)} lines to {path} (no changes)."
        return f"Wrote {_lines(after)} lines to {path} (+{added} -{removed})."

    return EditExecution(inv, _edit_args(inv.args, "contents"), lambda _before: contents, describe)


WRITE = ToolDef(
    name="Write",
    ui_field="edit_tool_call",
    placeholder=agent.EditToolCall,
    parse=_parse_write,
    ui=lambda args: agent.EditToolCall(args=_edit_args(args, "contents")),
    execute=_execute_write,
    args_stream=lambda: ContentStream("contents"),
)


# --- StrReplace ------------------------------------------------------------------------------


def _parse_str_replace(args: Mapping[str, Any]) -> Mapping[str, Any]:
    path = require_str(args, "path")
    old = normalize_newlines(require_str(args, "old_string"))
    new = normalize_newlines(require_str(args, "new_string", allow_empty=True))
    if old == new:
        # Caught here too so that a no-op costs no round-trip.
        raise ToolArgError("old_string and new_string are identical; there is nothing to change")
    replace_all = optional_bool(args, "replace_all") or False
    return {"path": path, "old_string": old, "new_string": new, "replace_all": replace_all}


def _execute_str_replace(inv: Invocation) -> EditExecution:
    path: str = inv.args["path"]
    old: str = inv.args["old_string"]
    new: str = inv.args["new_string"]
    replace_all: bool = inv.args["replace_all"]
    replaced = 0

    def apply(before: str | None) -> str:
        nonlocal replaced
        if before is None:
            raise EditError(f"file not found: {path}")
        after = replace_unique(before, old, new, replace_all, path=path)
        replaced = before.count(old) if replace_all else 1
        return after

    def describe(before: str | None, after: str, added: int, removed: int) -> str:
        noun = "occurrence" if replaced == 1 else "occurrences"
        return f"Replaced {replaced} {noun} in {path} (+{added} -{removed})."

    return EditExecution(inv, _edit_args(inv.args, "new_string"), apply, describe)


STR_REPLACE = ToolDef(
    name="StrReplace",
    ui_field="edit_tool_call",
    placeholder=agent.EditToolCall,
    parse=_parse_str_replace,
    ui=lambda args: agent.EditToolCall(args=_edit_args(args, "new_string")),
    execute=_execute_str_replace,
    args_stream=lambda: ContentStream("new_string"),
)


TOOLS: tuple[ToolDef, ...] = (WRITE, STR_REPLACE)
