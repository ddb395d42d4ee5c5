from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import betterproto2
import pytest

from byok.cursor.tools import delete_tool, read_lints_tool, read_tool
from byok.cursor.tools.base import Execution, Finish, Invocation, SendExec, ToolArgError, ToolDef, ToolOutcome
from byok.cursor.tools.delete_tool import DELETE
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.read_lints_tool import READ_LINTS
from byok.cursor.tools.read_tool import READ
from byok.pb.agent import v1 as agent

TOOLS = (READ, DELETE, READ_LINTS)
CALL_ID = "toolu_01"
CLOSED = "the client closed the tool stream before sending a result"


def start(tool: ToolDef, raw: Mapping[str, Any]) -> tuple[Execution, Any]:
    """Parse, execute and start; returns the execution and the one Exec variant it sent."""
    inv = Invocation(call_id=CALL_ID, name=tool.name, model_call_id="llm-1", args=tool.parse(raw))
    execution = tool.execute(inv)
    actions = execution.start()
    assert len(actions) == 1 and isinstance(actions[0], SendExec)
    return execution, betterproto2.which_one_of(actions[0].message, "message")


def finished(actions: list) -> ToolOutcome:
    assert len(actions) == 1 and isinstance(actions[0], Finish)
    return actions[0].outcome


def answer(tool: ToolDef, raw: Mapping[str, Any], **result: Any) -> ToolOutcome:
    execution, _ = start(tool, raw)
    return finished(execution.on_result(agent.ExecClientMessage(id=1, exec_id=CALL_ID, **result)))


def card(outcome: ToolOutcome, field: str) -> Any:
    name, record = betterproto2.which_one_of(outcome.ui, "tool")
    assert name == field
    return record


def parse_error(tool: ToolDef, raw: Mapping[str, Any]) -> str:
    with pytest.raises(ToolArgError) as info:
        tool.parse(raw)
    return str(info.value)


def test_tools_export() -> None:
    assert [t.name for t in TOOLS] == ["Read", "Delete", "ReadLints"]
    assert (read_tool.TOOLS, delete_tool.TOOLS, read_lints_tool.TOOLS) == ((READ,), (DELETE,), (READ_LINTS,))


# --- Read --------------------------------------------------------------------------------------


def read(content: str | None = None, raw: Mapping[str, Any] | None = None, **success: Any) -> ToolOutcome:
    if content is not None:
        success["content"] = content
    success.setdefault("path", "/w/a.py")
    return answer(
        READ, raw or {"path": "/w/a.py"}, read_result=agent.ReadResult(success=agent.ReadSuccess(**success))
    )


def test_read_parse_accepts_and_normalises() -> None:
    assert READ.parse({"path": "/w/a.py"}) == {"path": "/w/a.py", "offset": None, "limit": None}
    assert READ.parse({"path": "/a", "offset": -5, "limit": 10.0, "extra": 1}) == {
        "path": "/a",
        "offset": -5,
        "limit": 10,
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "missing required argument 'path'"),
        ({"path": 3}, "argument 'path' must be a string, got int"),
        ({"path": ""}, "argument 'path' must not be empty"),
        ({"path": "/a", "offset": "5"}, "argument 'offset' must be an integer, got str"),
        ({"path": "/a", "offset": 1.5}, "argument 'offset' must be an integer, got float"),
        ({"path": "/a", "limit": 0}, "argument 'limit' must be >= 1, got 0"),
        ({"path": "/a", "limit": True}, "argument 'limit' must be an integer, got bool"),
        ({"path": "/a", "offset": 2**40}, "argument 'offset' is out of range"),
    ],
)
def test_read_parse_rejects(raw: Mapping[str, Any], message: str) -> None:
    assert message in parse_error(READ, raw)


def test_read_ui_record_and_exec() -> None:
    args = READ.parse({"path": "/w/a.py", "offset": 3, "limit": 2})
    assert READ.ui(args) == agent.ReadToolCall(args=agent.ReadToolArgs(path="/w/a.py", offset=3, limit=2))
    _, (field, exec_args) = start(READ, {"path": "/w/a.py", "offset": 3, "limit": 2})
    assert field == "read_args"
    assert exec_args == agent.ReadArgs(path="/w/a.py", tool_call_id=CALL_ID, offset=3, limit=2)
    _, (_, bare) = start(READ, {"path": "/w/a.py"})
    assert bare.offset is None and bare.limit is None


def test_read_success_numbers_lines() -> None:
    outcome = read("import os\n\nprint(os.sep)\n", total_lines=3, file_size=27)
    assert outcome.content == "     1|import os\n     2|\n     3|print(os.sep)"
    assert not outcome.is_error
    record = card(outcome, "read_tool_call")
    assert record.args == agent.ReadToolArgs(path="/w/a.py")
    assert record.result.success == agent.ReadToolSuccess(
        content="import os\n\nprint(os.sep)", total_lines=3, file_size=27, path="/w/a.py"
    )


def test_read_crlf_and_missing_final_newline() -> None:
    assert read("a\r\nb").content == "     1|a\n     2|b"


def test_read_applies_range_the_client_did_not_apply() -> None:
    outcome = read("a\nb\nc\nd\n", {"path": "/w/a.py", "offset": 2, "limit": 2})
    assert outcome.content == "     2|b\n     3|c\n\n[Showing lines 2-3 of 4. Continue with offset=4.]"
    success = card(outcome, "read_tool_call").result.success
    assert success.content == "b\nc"
    assert success.read_range == agent.ReadRange(start_line=2, end_line=3)


def test_read_negative_offset_counts_from_the_end() -> None:
    outcome = read("a\nb\nc\n", {"path": "/w/a.py", "offset": -1})
    assert outcome.content == "     3|c\n\n[Showing lines 3-3 of 3.]"


def test_read_keeps_a_range_the_client_applied() -> None:
    outcome = read("b\nc\n", {"path": "/w/a.py", "offset": 2, "limit": 2}, total_lines=5, range_applied=True)
    assert outcome.content == "     2|b\n     3|c\n\n[Showing lines 2-3 of 5. Continue with offset=4.]"


def test_read_truncated_by_client() -> None:
    outcome = read("a\nb\n", total_lines=10, truncated=True)
    assert outcome.content == (
        "     1|a\n     2|b\n\n[Showing lines 1-2 of 10. Continue with offset=3. "
        "The client truncated the content; read the rest with offset and limit.]"
    )
    assert not outcome.is_error
    assert card(outcome, "read_tool_call").result.success.exceeded_limit


def test_read_empty_file() -> None:
    outcome = read("")
    assert outcome.content == "File is empty."
    assert not outcome.is_error
    assert card(outcome, "read_tool_call").result.success.is_empty


def test_read_offset_past_the_end() -> None:
    outcome = read("a\nb\n", {"path": "/w/a.py", "offset": 10})
    assert outcome.content == "No lines to show: the file has 2 lines; offset 10 is past its end."
    assert not outcome.is_error


def test_read_binary_data_is_described_not_sent() -> None:
    outcome = read(data=b"\x89PNG", path="/w/logo.png", file_size=4)  # too short to be a PNG
    assert outcome.content == "/w/logo.png is a binary file (4 bytes); its content cannot be shown as text."
    assert not outcome.is_error and outcome.images == ()
    assert card(outcome, "read_tool_call").result.success.data == b"\x89PNG"


PNG = b"\x89PNG\r\n\x1a\n" + bytes(24)
JPEG = b"\xff\xd8\xff\xe0" + bytes(16)


@pytest.mark.parametrize(("data", "media_type"), [(PNG, "image/png"), (JPEG, "image/jpeg")])
def test_read_of_an_image_gives_the_model_the_image(data: bytes, media_type: str) -> None:
    # The file's name says PNG; the bytes decide.
    outcome = read(data=data, path="/w/shot.png", file_size=len(data))
    assert outcome.content == f"/w/shot.png is an image ({media_type}, {len(data)} bytes); here it is."
    (image,) = outcome.images
    assert (image.media_type, image.data, image.size) == (media_type, data, len(data))
    assert card(outcome, "read_tool_call").result.success.data == data


def test_read_of_an_image_for_a_model_without_vision_says_so() -> None:
    inv = Invocation(
        call_id=CALL_ID,
        name="Read",
        model_call_id="llm-1",
        args=READ.parse({"path": "/w/shot.png"}),
        env=ToolEnv(vision=False),
    )
    execution = READ.execute(inv)
    execution.start()
    success = agent.ReadSuccess(data=PNG, path="/w/shot.png", file_size=len(PNG))
    result = agent.ExecClientMessage(id=1, exec_id=CALL_ID, read_result=agent.ReadResult(success=success))
    outcome = finished(execution.on_result(result))
    assert outcome.images == () and not outcome.is_error
    assert outcome.content == (
        "/w/shot.png is an image (image/png, 32 bytes); this model is configured without vision "
        "(vision = false), so it cannot be shown."
    )


def test_read_content_by_blob_reference_is_an_error() -> None:
    outcome = read(output_blob_id=b"\x01" * 32)
    assert outcome.is_error and "blob reference" in outcome.content


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (agent.ReadResult(error=agent.ReadError(path="/w/a.py", error="EIO")), "Cannot read /w/a.py: EIO"),
        (
            agent.ReadResult(rejected=agent.ReadRejected(reason="user said no")),
            "Reading /w/a.py was rejected: user said no",
        ),
        (agent.ReadResult(rejected=agent.ReadRejected()), "Reading /w/a.py was rejected."),
        (
            agent.ReadResult(file_not_found=agent.ReadFileNotFound(path="/w/a.py")),
            "Cannot read /w/a.py: file not found.",
        ),
        (
            agent.ReadResult(permission_denied=agent.ReadPermissionDenied()),
            "Cannot read /w/a.py: permission denied.",
        ),
        (
            agent.ReadResult(invalid_file=agent.ReadInvalidFile(reason="is a directory")),
            "Cannot read /w/a.py: is a directory",
        ),
        (agent.ReadResult(), "protocol error: read_result carries no result"),
    ],
)
def test_read_failures(result: agent.ReadResult, message: str) -> None:
    outcome = answer(READ, {"path": "/w/a.py"}, read_result=result)
    assert outcome.content == message
    assert outcome.is_error
    record = card(outcome, "read_tool_call")
    assert record.args.path == "/w/a.py"
    assert record.result == agent.ReadToolResult(error=agent.ReadToolError(error_message=message))


def test_read_wrong_result_type_is_a_protocol_error() -> None:
    outcome = answer(READ, {"path": "/w/a.py"}, write_result=agent.WriteResult())
    assert outcome.content == "protocol error: expected read_result, got write_result"
    assert outcome.is_error
    assert card(outcome, "read_tool_call").result.error.error_message == outcome.content
    empty = answer(READ, {"path": "/w/a.py"})
    assert empty.content == "protocol error: expected read_result, got an empty message"


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_throw_and_stream_close(tool: ToolDef) -> None:
    raw = {"path": "/w/a.py"} if tool is not READ_LINTS else {}
    execution, _ = start(tool, raw)
    thrown = finished(execution.on_throw("ENOENT: boom"))
    assert thrown.content == "ENOENT: boom" and thrown.is_error
    assert card(thrown, tool.ui_field).args == tool.ui(tool.parse(raw)).args
    assert execution.on_stream_close() == []
    assert execution.on_throw("again") == []

    execution, _ = start(tool, raw)
    closed = finished(execution.on_stream_close())
    assert closed.content == CLOSED and closed.is_error
    assert execution.on_result(agent.ExecClientMessage(id=1)) == []


def test_stream_close_after_result_is_a_no_op() -> None:
    execution, _ = start(READ, {"path": "/w/a.py"})
    msg = agent.ExecClientMessage(read_result=agent.ReadResult(success=agent.ReadSuccess(content="x\n")))
    assert not finished(execution.on_result(msg)).is_error
    assert execution.on_stream_close() == []
    assert execution.on_result(msg) == []


# --- Delete ------------------------------------------------------------------------------------


def test_delete_parse() -> None:
    assert DELETE.parse({"path": "/w/old.txt"}) == {"path": "/w/old.txt"}
    assert parse_error(DELETE, {}) == "missing required argument 'path'"
    assert parse_error(DELETE, {"path": ["/a"]}) == "argument 'path' must be a string, got list"
    assert parse_error(DELETE, {"path": ""}) == "argument 'path' must not be empty"


def test_delete_exec_and_success() -> None:
    _, (field, exec_args) = start(DELETE, {"path": "/w/old.txt"})
    assert field == "delete_args"
    assert exec_args == agent.DeleteArgs(path="/w/old.txt", tool_call_id=CALL_ID)
    result = agent.DeleteResult(success=agent.DeleteSuccess(path="/w/old.txt", deleted_file="/w/old.txt"))
    outcome = answer(DELETE, {"path": "/w/old.txt"}, delete_result=result)
    assert outcome.content == "Deleted /w/old.txt."
    assert not outcome.is_error
    assert card(outcome, "delete_tool_call") == agent.DeleteToolCall(
        args=agent.DeleteArgs(path="/w/old.txt"), result=result
    )


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (
            agent.DeleteResult(file_not_found=agent.DeleteFileNotFound()),
            "Cannot delete /w/x: file not found.",
        ),
        (
            agent.DeleteResult(not_file=agent.DeleteNotFile(actual_type="directory")),
            "Cannot delete /w/x: not a regular file (it is a directory).",
        ),
        (
            agent.DeleteResult(
                permission_denied=agent.DeletePermissionDenied(
                    client_visible_error="EACCES", is_readonly=True
                )
            ),
            "Cannot delete /w/x: permission denied (the file is read-only): EACCES",
        ),
        (
            agent.DeleteResult(file_busy=agent.DeleteFileBusy()),
            "Cannot delete /w/x: the file is in use by another process.",
        ),
        (
            agent.DeleteResult(rejected=agent.DeleteRejected(reason="not allowed")),
            "Deleting /w/x was rejected: not allowed",
        ),
        (agent.DeleteResult(error=agent.DeleteError(error="disk gone")), "Cannot delete /w/x: disk gone"),
    ],
)
def test_delete_failures(result: agent.DeleteResult, message: str) -> None:
    outcome = answer(DELETE, {"path": "/w/x"}, delete_result=result)
    assert outcome.content == message
    assert outcome.is_error
    assert card(outcome, "delete_tool_call").result == result


def test_delete_empty_and_wrong_results() -> None:
    empty = answer(DELETE, {"path": "/w/x"}, delete_result=agent.DeleteResult())
    assert empty.content == "protocol error: delete_result carries no result" and empty.is_error
    wrong = answer(DELETE, {"path": "/w/x"}, read_result=agent.ReadResult())
    assert wrong.content == "protocol error: expected delete_result, got read_result" and wrong.is_error
    assert card(wrong, "delete_tool_call").result.error.error == wrong.content


# --- ReadLints ---------------------------------------------------------------------------------


def diag(
    line: int, col: int, severity: agent.DiagnosticSeverity, message: str, **kw: Any
) -> agent.Diagnostic:
    pos = agent.Position(line=line, column=col)
    return agent.Diagnostic(severity=severity, range=agent.Range(start=pos, end=pos), message=message, **kw)


def lints(raw: Mapping[str, Any], success: agent.DiagnosticsSuccess) -> ToolOutcome:
    return answer(READ_LINTS, raw, diagnostics_result=agent.DiagnosticsResult(success=success))


def test_read_lints_parse() -> None:
    assert READ_LINTS.parse({}) == {"paths": ()}
    assert READ_LINTS.parse({"paths": ["a.py", "b.py"]}) == {"paths": ("a.py", "b.py")}
    assert parse_error(READ_LINTS, {"paths": "a.py"}) == "argument 'paths' must be a list of strings"
    assert parse_error(READ_LINTS, {"paths": [1]}) == "argument 'paths' must be a list of strings"


def test_read_lints_sends_first_path_only() -> None:
    _, (field, exec_args) = start(READ_LINTS, {"paths": ["/w/a.py", "/w/b.py"]})
    assert field == "diagnostics_args"
    assert exec_args == agent.DiagnosticsArgs(path="/w/a.py", tool_call_id=CALL_ID)
    _, (_, whole) = start(READ_LINTS, {})
    assert whole == agent.DiagnosticsArgs(path="", tool_call_id=CALL_ID)


def test_read_lints_formats_diagnostics() -> None:
    success = agent.DiagnosticsSuccess(
        path="/w/a.py",
        diagnostics=[
            diag(
                12,
                5,
                agent.DiagnosticSeverity.ERROR,
                "Undefined name 'x'",
                source="Pyright",
                code="reportUndefined",
            ),
            diag(
                20,
                1,
                agent.DiagnosticSeverity.WARNING,
                "Line too long\n(120 > 100)",
                source="ruff",
                is_stale=True,
            ),
        ],
        total_diagnostics=2,
    )
    outcome = lints({"paths": ["/w/a.py"]}, success)
    assert outcome.content == (
        "/w/a.py: 2 diagnostics\n"
        "  12:5 error: Undefined name 'x' (Pyright reportUndefined)\n"
        "  20:1 warning: Line too long\n    (120 > 100) (ruff) [stale]"
    )
    assert not outcome.is_error
    record = card(outcome, "read_lints_tool_call")
    assert record.args == agent.ReadLintsToolArgs(paths=["/w/a.py"])
    ui = record.result.success
    assert ui.total_files == 1 and ui.total_diagnostics == 2
    assert ui.file_diagnostics[0].path == "/w/a.py"
    assert ui.file_diagnostics[0].diagnostics[0].range.start == agent.Position(line=12, column=5)
    assert ui.file_diagnostics[0].diagnostics[1].is_stale


def test_read_lints_none_found() -> None:
    outcome = lints({"paths": ["/w/a.py"]}, agent.DiagnosticsSuccess(path="/w/a.py"))
    assert outcome.content == "No linter errors found in /w/a.py."
    assert not outcome.is_error
    assert card(outcome, "read_lints_tool_call").result.success.file_diagnostics == []
    assert lints({}, agent.DiagnosticsSuccess()).content == "No linter errors found."


def test_read_lints_says_which_paths_were_not_checked() -> None:
    outcome = lints({"paths": ["/w/a.py", "/w/b.py", "/w/c.py"]}, agent.DiagnosticsSuccess(path="/w/a.py"))
    assert outcome.content == (
        "No linter errors found in /w/a.py.\n\n"
        "[Only /w/a.py was checked; call ReadLints again for: /w/b.py, /w/c.py.]"
    )


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (
            agent.DiagnosticsResult(error=agent.DiagnosticsError(error="LSP down")),
            "Cannot read diagnostics for /w/a.py: LSP down",
        ),
        (
            agent.DiagnosticsResult(rejected=agent.DiagnosticsRejected(reason="no")),
            "Reading diagnostics for /w/a.py was rejected: no",
        ),
        (
            agent.DiagnosticsResult(file_not_found=agent.DiagnosticsFileNotFound()),
            "Cannot read diagnostics for /w/a.py: file not found.",
        ),
        (
            agent.DiagnosticsResult(permission_denied=agent.DiagnosticsPermissionDenied()),
            "Cannot read diagnostics for /w/a.py: permission denied.",
        ),
        (agent.DiagnosticsResult(), "protocol error: diagnostics_result carries no result"),
    ],
)
def test_read_lints_failures(result: agent.DiagnosticsResult, message: str) -> None:
    outcome = answer(READ_LINTS, {"paths": ["/w/a.py"]}, diagnostics_result=result)
    assert outcome.content == message and outcome.is_error
    assert card(outcome, "read_lints_tool_call").result.error.error_message == message


def test_read_lints_failure_without_path_names_the_workspace() -> None:
    result = agent.DiagnosticsResult(error=agent.DiagnosticsError(error="LSP down"))
    assert answer(READ_LINTS, {}, diagnostics_result=result).content == (
        "Cannot read diagnostics for the workspace: LSP down"
    )


def test_read_lints_wrong_result_type() -> None:
    outcome = answer(READ_LINTS, {}, grep_result=agent.GrepResult())
    assert outcome.content == "protocol error: expected diagnostics_result, got grep_result"
    assert outcome.is_error
