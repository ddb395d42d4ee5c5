from __future__ import annotations

import json
from typing import Any

import betterproto2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor.tools.base import Finish, Invocation, SendExec, ToolArgError, ToolDef, ToolOutcome
from byok.cursor.tools.edit_tools import MODEL_DIFF_LIMIT, STR_REPLACE, WRITE
from byok.cursor.tools.text_edit import normalize_newlines
from byok.pb.agent import v1 as agent

PATH = "/ws/src/app.py"


def execution(tool: ToolDef, **args: Any) -> Any:
    return tool.execute(Invocation("call-1", tool.name, "mc-1", tool.parse({"path": PATH, **args})))


def read_ok(content: str, **kw: Any) -> agent.ExecClientMessage:
    return agent.ExecClientMessage(
        id=1, read_result=agent.ReadResult(success=agent.ReadSuccess(path=PATH, content=content, **kw))
    )


def read_variant(**variant: Any) -> agent.ExecClientMessage:
    return agent.ExecClientMessage(id=1, read_result=agent.ReadResult(**variant))


NOT_FOUND = read_variant(file_not_found=agent.ReadFileNotFound(path=PATH))


def write_variant(**variant: Any) -> agent.ExecClientMessage:
    return agent.ExecClientMessage(id=2, write_result=agent.WriteResult(**variant))


WRITE_OK = write_variant(success=agent.WriteSuccess(path=PATH, lines_created=1, file_size=1))


def sent(actions: list[Any]) -> tuple[str, Any]:
    assert len(actions) == 1 and isinstance(actions[0], SendExec)
    return betterproto2.which_one_of(actions[0].message, "message")


def finished(actions: list[Any]) -> ToolOutcome:
    assert len(actions) == 1 and isinstance(actions[0], Finish)
    return actions[0].outcome


def edit_result(outcome: ToolOutcome) -> tuple[str, Any]:
    assert outcome.ui.edit_tool_call is not None
    return betterproto2.which_one_of(outcome.ui.edit_tool_call.result, "result")


def run_to_write(ex: Any, read: agent.ExecClientMessage) -> agent.WriteArgs:
    field, read_args = sent(ex.start())
    assert field == "read_args"
    assert (read_args.path, read_args.tool_call_id) == (PATH, "call-1")
    field, write_args = sent(ex.on_result(read))
    assert field == "write_args"
    assert (write_args.path, write_args.tool_call_id) == (PATH, "call-1")
    assert write_args.return_file_content_after_write is False
    return write_args


# --- Write ---------------------------------------------------------------------------------


def test_write_new_file() -> None:
    ex = execution(WRITE, contents="one\r\ntwo\n")
    assert run_to_write(ex, NOT_FOUND).file_text == "one\ntwo\n"
    outcome = finished(ex.on_result(WRITE_OK))
    assert outcome.is_error is False
    assert outcome.content == f"Created {PATH} (2 lines)."
    kind, success = edit_result(outcome)
    assert kind == "success"
    assert (success.path, success.lines_added, success.lines_removed) == (PATH, 2, 0)
    assert success.before_full_file_content is None
    assert success.after_full_file_content == "one\ntwo\n"
    assert success.diff_string.startswith("--- /dev/null\n")
    assert outcome.ui.edit_tool_call.args == agent.EditArgs(path=PATH, stream_content="one\ntwo\n")
    assert ex.on_stream_close() == []
    assert ex.on_result(WRITE_OK) == []


def test_write_over_crlf_file() -> None:
    ex = execution(WRITE, contents="a\nc\n")
    assert run_to_write(ex, read_ok("a\r\nb\r\n")).file_text == "a\nc\n"
    outcome = finished(ex.on_result(WRITE_OK))
    assert outcome.content.startswith(f"Wrote 2 lines to {PATH} (+1 -1).\n\n--- {PATH}\n+++ {PATH}\n@@")
    assert "-b\n+c\n" in outcome.content
    _, success = edit_result(outcome)
    assert success.before_full_file_content == "a\nb\n"
    assert (success.lines_added, success.lines_removed) == (1, 1)


def test_write_same_content() -> None:
    ex = execution(WRITE, contents="x\n")
    run_to_write(ex, read_ok("x\r\n"))
    assert finished(ex.on_result(WRITE_OK)).content == f"Wrote 1 lines to {PATH} (no changes)."


def test_model_diff_is_capped() -> None:
    big = "".join(f"line {i}\n" for i in range(5000))
    ex = execution(WRITE, contents=big)
    run_to_write(ex, read_ok("old\n"))
    outcome = finished(ex.on_result(WRITE_OK))
    assert len(outcome.content) < MODEL_DIFF_LIMIT + 200
    assert "(diff truncated:" in outcome.content
    _, success = edit_result(outcome)
    assert success.lines_added == 5000  # the card keeps the whole diff
    assert len(success.diff_string) > MODEL_DIFF_LIMIT


# --- StrReplace ----------------------------------------------------------------------------


def test_str_replace_success() -> None:
    ex = execution(STR_REPLACE, old_string="b = 2", new_string="b = 3")
    assert run_to_write(ex, read_ok("a = 1\nb = 2\n")).file_text == "a = 1\nb = 3\n"
    outcome = finished(ex.on_result(WRITE_OK))
    assert not outcome.is_error
    assert outcome.content.startswith(f"Replaced 1 occurrence in {PATH} (+1 -1).\n\n---")
    _, success = edit_result(outcome)
    assert success.before_full_file_content == "a = 1\nb = 2\n"
    assert success.after_full_file_content == "a = 1\nb = 3\n"
    assert outcome.ui.edit_tool_call.args.stream_content == "b = 3"


def test_str_replace_crlf_file() -> None:
    ex = execution(STR_REPLACE, old_string="a\nb", new_string="a\r\nB")
    assert run_to_write(ex, read_ok("a\r\nb\r\nc\r\n")).file_text == "a\nB\nc\n"


def test_str_replace_all() -> None:
    ex = execution(STR_REPLACE, old_string="x", new_string="y", replace_all=True)
    assert run_to_write(ex, read_ok("x x\nx\n")).file_text == "y y\ny\n"
    assert finished(ex.on_result(WRITE_OK)).content.startswith(f"Replaced 3 occurrences in {PATH}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("nothing here\n", f"Error: old_string not found in {PATH}"),
        ("x x\n", "Error: old_string occurs 2 times"),
    ],
)
def test_str_replace_no_unique_match_sends_no_write(content: str, message: str) -> None:
    ex = execution(STR_REPLACE, old_string="x", new_string="y")
    ex.start()
    outcome = finished(ex.on_result(read_ok(content)))
    assert outcome.is_error
    assert outcome.content.startswith(message)
    kind, error = edit_result(outcome)
    assert kind == "error" and error.path == PATH


def test_str_replace_missing_file() -> None:
    ex = execution(STR_REPLACE, old_string="x", new_string="y")
    ex.start()
    outcome = finished(ex.on_result(NOT_FOUND))
    assert outcome.is_error and outcome.content == f"Error: file not found: {PATH}"
    assert edit_result(outcome)[0] == "file_not_found"


# --- argument parsing and the card -----------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "problem"),
    [
        (WRITE, {"contents": "x"}, "missing required argument 'path'"),
        (WRITE, {"path": PATH}, "missing required argument 'contents'"),
        (WRITE, {"path": PATH, "contents": 3}, "must be a string"),
        (STR_REPLACE, {"path": PATH, "old_string": "", "new_string": "y"}, "must not be empty"),
        (STR_REPLACE, {"path": PATH, "old_string": "a", "new_string": "a"}, "identical"),
        (STR_REPLACE, {"path": PATH, "old_string": "a", "new_string": "b", "replace_all": "yes"}, "boolean"),
    ],
)
def test_parse_errors(tool: ToolDef, args: dict[str, Any], problem: str) -> None:
    with pytest.raises(ToolArgError, match=problem):
        tool.parse(args)


def test_empty_contents_and_new_string_are_allowed() -> None:
    assert WRITE.parse({"path": PATH, "contents": ""})["contents"] == ""
    assert STR_REPLACE.parse({"path": PATH, "old_string": "a", "new_string": ""})["new_string"] == ""


def test_ui_records() -> None:
    assert WRITE.placeholder() == agent.EditToolCall()
    args = WRITE.parse({"path": PATH, "contents": "a\r\n"})
    assert WRITE.tool_call(WRITE.ui(args)).edit_tool_call == agent.EditToolCall(
        args=agent.EditArgs(path=PATH, stream_content="a\n")
    )
    args = STR_REPLACE.parse({"path": PATH, "old_string": "a", "new_string": "b"})
    assert STR_REPLACE.ui(args).args == agent.EditArgs(path=PATH, stream_content="b")


def stream(tool: ToolDef, source: str, cuts: list[int]) -> str:
    assert tool.args_stream is not None
    points = sorted({min(c, len(source)) for c in cuts})
    args_stream = tool.args_stream()
    out = []
    for a, b in zip([0, *points], [*points, len(source)], strict=True):
        for delta in args_stream.feed(source[a:b]):
            name, value = betterproto2.which_one_of(delta, "delta")
            assert name == "edit_tool_call_delta" and value.stream_content_delta
            out.append(value.stream_content_delta)
    return "".join(out)


text_with_newlines = st.text(
    alphabet=st.sampled_from(["a", "\r", "\n", '"', "\\", "é", "😀", "\t"]), max_size=50
)
cut_lists = st.lists(st.integers(min_value=0, max_value=400), max_size=20)


@given(text=text_with_newlines, cuts=cut_lists, ascii_only=st.booleans())
def test_write_args_stream_any_fragmentation(text: str, cuts: list[int], ascii_only: bool) -> None:
    source = json.dumps({"path": PATH, "contents": text}, ensure_ascii=ascii_only)
    assert stream(WRITE, source, cuts) == normalize_newlines(text)


@given(text=text_with_newlines, cuts=cut_lists)
def test_str_replace_args_stream_streams_new_string(text: str, cuts: list[int]) -> None:
    source = json.dumps({"path": PATH, "old_string": "o\r\nld", "new_string": text, "replace_all": True})
    assert stream(STR_REPLACE, source, cuts) == normalize_newlines(text)


def test_args_stream_flushes_final_cr_when_value_closes() -> None:
    assert WRITE.args_stream is not None
    s = WRITE.args_stream()
    assert s.feed('{"contents": "a\\r') != []  # "a" goes out, the CR is held
    (delta,) = s.feed('"')
    assert delta.edit_tool_call_delta.stream_content_delta == "\n"
    assert s.feed("}") == []


# --- failures ------------------------------------------------------------------------------


BINARY = agent.ExecClientMessage(
    read_result=agent.ReadResult(success=agent.ReadSuccess(path=PATH, data=b"\x89PNG"))
)
READ_FAILURES = [
    (
        read_variant(permission_denied=agent.ReadPermissionDenied(path=PATH)),
        "read_permission_denied",
        f"Error: permission denied reading {PATH}",
    ),
    (
        read_variant(rejected=agent.ReadRejected(path=PATH, reason="no")),
        "rejected",
        f"Error: the user rejected reading {PATH}: no",
    ),
    (
        read_variant(error=agent.ReadError(path=PATH, error="boom")),
        "error",
        f"Error: cannot read {PATH}: boom",
    ),
    (
        read_variant(invalid_file=agent.ReadInvalidFile(path=PATH, reason="a directory")),
        "error",
        f"Error: cannot read {PATH}: a directory",
    ),
    (BINARY, "error", f"Error: cannot edit {PATH}: it is not a text file"),
    (read_ok("partial", truncated=True), "error", f"Error: cannot edit {PATH}: the client returned only"),
    (agent.ExecClientMessage(read_result=agent.ReadResult()), "error", "Error: protocol error"),
]


@pytest.mark.parametrize(("read", "kind", "message"), READ_FAILURES)
def test_read_failures(read: agent.ExecClientMessage, kind: str, message: str) -> None:
    ex = execution(WRITE, contents="x")
    ex.start()
    outcome = finished(ex.on_result(read))
    assert outcome.is_error and outcome.content.startswith(message)
    assert edit_result(outcome)[0] == kind
    assert ex.on_stream_close() == []


WRITE_FAILURES = [
    (
        write_variant(
            permission_denied=agent.WritePermissionDenied(path=PATH, error="EACCES", is_readonly=True)
        ),
        "write_permission_denied",
        f"Error: permission denied writing {PATH}: EACCES",
    ),
    (
        write_variant(no_space=agent.WriteNoSpace(path=PATH)),
        "error",
        f"Error: no space left on device writing {PATH}",
    ),
    (
        write_variant(error=agent.WriteError(path=PATH, error="disk on fire")),
        "error",
        f"Error: cannot write {PATH}: disk on fire",
    ),
    (
        write_variant(rejected=agent.WriteRejected(path=PATH, reason="")),
        "rejected",
        f"Error: the user rejected writing {PATH}",
    ),
]


@pytest.mark.parametrize(("write", "kind", "message"), WRITE_FAILURES)
def test_write_failures(write: agent.ExecClientMessage, kind: str, message: str) -> None:
    ex = execution(WRITE, contents="x")
    run_to_write(ex, NOT_FOUND)
    outcome = finished(ex.on_result(write))
    assert outcome.is_error and outcome.content == message
    kind_seen, value = edit_result(outcome)
    assert kind_seen == kind
    if kind == "write_permission_denied":
        assert (value.error, value.is_readonly) == ("EACCES", True)


def test_wrong_result_type_in_each_phase() -> None:
    ex = execution(WRITE, contents="x")
    ex.start()
    outcome = finished(ex.on_result(WRITE_OK))
    assert outcome.is_error
    assert outcome.content == "Error: protocol error: expected read_result, got write_result"

    ex = execution(WRITE, contents="x")
    run_to_write(ex, NOT_FOUND)
    outcome = finished(ex.on_result(NOT_FOUND))
    assert outcome.content == "Error: protocol error: expected write_result, got read_result"
    assert edit_result(outcome)[0] == "error"


def test_throw_in_each_phase() -> None:
    ex = execution(WRITE, contents="x")
    ex.start()
    outcome = finished(ex.on_throw("no workspace"))
    assert outcome.is_error and outcome.content == "Error: no workspace"
    assert ex.on_throw("again") == []

    ex = execution(STR_REPLACE, old_string="x", new_string="y")
    run_to_write(ex, read_ok("x"))
    assert finished(ex.on_throw("")).content == "Error: the client failed to run the tool"


def test_stream_close_rules() -> None:
    ex = execution(WRITE, contents="x")
    ex.start()
    outcome = finished(ex.on_stream_close())
    assert outcome.is_error and "closed the tool stream" in outcome.content
    assert ex.on_stream_close() == []

    # The run layer retires the read's exec id when the write goes out, so a close seen in the
    # write phase is the write's own, arriving before its result.
    ex = execution(WRITE, contents="x")
    run_to_write(ex, NOT_FOUND)
    assert finished(ex.on_stream_close()).is_error

    ex = execution(WRITE, contents="x")
    run_to_write(ex, NOT_FOUND)
    finished(ex.on_result(WRITE_OK))
    assert ex.on_stream_close() == []
    assert ex.on_throw("late") == []
