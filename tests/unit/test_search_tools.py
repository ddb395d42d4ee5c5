from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import betterproto2
import pytest

from byok.cursor.tools.base import Execution, Finish, Invocation, SendExec, ToolArgError, ToolDef, ToolOutcome
from byok.cursor.tools.search_tools import GLOB, GREP, TOOLS
from byok.pb.agent import v1 as agent

CALL_ID = "call_7"
CLOSED = "the client closed the tool stream before sending a result"


def start(tool: ToolDef, raw: Mapping[str, Any]) -> tuple[Execution, Any]:
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
    return finished(execution.on_result(agent.ExecClientMessage(id=3, exec_id=CALL_ID, **result)))


def card(outcome: ToolOutcome, field: str) -> Any:
    name, record = betterproto2.which_one_of(outcome.ui, "tool")
    assert name == field
    return record


def parse_error(tool: ToolDef, raw: Mapping[str, Any]) -> str:
    with pytest.raises(ToolArgError) as info:
        tool.parse(raw)
    return str(info.value)


def success(*unions: agent.GrepUnionResult, roots: tuple[str, ...] = ("/w",), **kw: Any) -> agent.GrepResult:
    return agent.GrepResult(
        success=agent.GrepSuccess(workspace_results=dict(zip(roots, unions, strict=True)), **kw)
    )


def files(*paths: str, **kw: Any) -> agent.GrepUnionResult:
    return agent.GrepUnionResult(files=agent.GrepFilesResult(files=list(paths), total_files=len(paths), **kw))


def match(line: int, text: str, *, context: bool = False, cut: bool = False) -> agent.GrepContentMatch:
    return agent.GrepContentMatch(
        line_number=line, content=text, is_context_line=context, content_truncated=cut
    )


def test_tools_export() -> None:
    assert [t.name for t in TOOLS] == ["Grep", "Glob"]


# --- Grep --------------------------------------------------------------------------------------

FULL = {
    "pattern": r"def \w+",
    "path": "/w/src",
    "glob": "*.py",
    "type": "py",
    "output_mode": "content",
    "-A": 2,
    "-B": 1,
    "-C": 3,
    "-i": True,
    "head_limit": 50,
    "offset": 10,
    "multiline": False,
}


def test_grep_parse_accepts_and_normalises() -> None:
    assert GREP.parse(FULL) == FULL
    minimal = GREP.parse({"pattern": "TODO", "path": "", "-A": 2.0})
    assert minimal["pattern"] == "TODO" and minimal["path"] is None and minimal["-A"] == 2
    assert minimal["output_mode"] is None and minimal["-i"] is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "missing required argument 'pattern'"),
        ({"pattern": ""}, "argument 'pattern' must not be empty"),
        ({"pattern": 5}, "argument 'pattern' must be a string, got int"),
        (
            {"pattern": "x", "output_mode": "lines"},
            "argument 'output_mode' must be one of content, files_with_matches, count, got 'lines'",
        ),
        ({"pattern": "x", "-A": -1}, "argument '-A' must be >= 0, got -1"),
        ({"pattern": "x", "-C": "3"}, "argument '-C' must be an integer, got str"),
        ({"pattern": "x", "head_limit": -5}, "argument 'head_limit' must be >= 0, got -5"),
        ({"pattern": "x", "offset": 2**33}, "argument 'offset' is out of range: 8589934592"),
        ({"pattern": "x", "-i": "yes"}, "argument '-i' must be a boolean, got str"),
        ({"pattern": "x", "multiline": 1}, "argument 'multiline' must be a boolean, got int"),
        ({"pattern": "x", "glob": ["*.py"]}, "argument 'glob' must be a string, got list"),
    ],
)
def test_grep_parse_rejects(raw: Mapping[str, Any], message: str) -> None:
    assert parse_error(GREP, raw) == message


def test_grep_exec_maps_every_argument() -> None:
    _, (field, exec_args) = start(GREP, FULL)
    assert field == "grep_args"
    assert exec_args == agent.GrepArgs(
        pattern=r"def \w+",
        path="/w/src",
        glob="*.py",
        output_mode="content",
        context_after=2,
        context_before=1,
        context=3,
        case_insensitive=True,
        type="py",
        head_limit=50,
        multiline=False,
        offset=10,
        tool_call_id=CALL_ID,
    )
    _, (_, bare) = start(GREP, {"pattern": "x"})
    assert bare == agent.GrepArgs(pattern="x", tool_call_id=CALL_ID)


def test_grep_ui_record() -> None:
    assert GREP.ui(GREP.parse({"pattern": "x", "-i": True})) == agent.GrepToolCall(
        args=agent.GrepArgs(pattern="x", case_insensitive=True)
    )


def test_grep_content_mode() -> None:
    content = agent.GrepContentResult(
        matches=[
            agent.GrepFileMatch(
                file="src/a.py", matches=[match(3, "import os", context=True), match(4, "def main():\n")]
            ),
            agent.GrepFileMatch(file="src/b.py", matches=[match(10, "def helper(" + "x" * 10, cut=True)]),
        ],
        total_matched_lines=2,
    )
    result = success(agent.GrepUnionResult(content=content))
    outcome = answer(GREP, {"pattern": "def", "-B": 1}, grep_result=result)
    assert outcome.content == (
        "src/a.py-3-import os\nsrc/a.py:4:def main():\nsrc/b.py:10:def helper(xxxxxxxxxx [line truncated]"
    )
    assert not outcome.is_error
    record = card(outcome, "grep_tool_call")
    assert record == agent.GrepToolCall(args=agent.GrepArgs(pattern="def", context_before=1), result=result)


def test_grep_files_mode_keeps_client_order() -> None:
    outcome = answer(GREP, {"pattern": "x"}, grep_result=success(files("z.py", "a.py", "m/b.py")))
    assert outcome.content == "z.py\na.py\nm/b.py"


def test_grep_count_mode() -> None:
    counts = agent.GrepCountResult(
        counts=[agent.GrepFileCount(file="a.py", count=3), agent.GrepFileCount(file="b.py", count=1)]
    )
    outcome = answer(GREP, {"pattern": "x"}, grep_result=success(agent.GrepUnionResult(count=counts)))
    assert outcome.content == "a.py:3\nb.py:1"


@pytest.mark.parametrize(
    "result",
    [success(files()), agent.GrepResult(success=agent.GrepSuccess()), success(agent.GrepUnionResult())],
    ids=["no-files", "no-workspaces", "empty-union"],
)
def test_grep_no_matches(result: agent.GrepResult) -> None:
    outcome = answer(GREP, {"pattern": "needle", "path": "/w/src"}, grep_result=result)
    assert outcome.content == 'No matches found for pattern "needle" in /w/src.'
    assert not outcome.is_error
    assert answer(GREP, {"pattern": "n"}, grep_result=result).content == 'No matches found for pattern "n".'


def test_grep_several_workspaces_are_labelled() -> None:
    result = success(files("a.py"), files(), files("b.py"), roots=("/w1", "/w2", "/w3"))
    outcome = answer(GREP, {"pattern": "x"}, grep_result=result)
    assert outcome.content == "Results in /w1:\na.py\n\nResults in /w3:\nb.py"


def test_grep_active_editor_result_when_no_workspace_result() -> None:
    result = agent.GrepResult(success=agent.GrepSuccess(active_editor_result=files("/tmp/untitled.py")))
    assert answer(GREP, {"pattern": "x"}, grep_result=result).content == "/tmp/untitled.py"


def test_grep_truncation_and_head_limit_notes() -> None:
    truncated = success(files("a.py", "b.py", ripgrep_truncated=True))
    assert answer(GREP, {"pattern": "x"}, grep_result=truncated).content == (
        "a.py\nb.py\n\n[Results were truncated; narrow the search or page with head_limit and offset.]"
    )
    limited = success(files("c.py", "d.py", head_limit_applied=2, offset_applied=4))
    assert answer(GREP, {"pattern": "x"}, grep_result=limited).content == (
        "c.py\nd.py\n\n[Output limited to 2 entries; use offset=6 for more.]"
    )
    under = success(files("c.py", head_limit_applied=2))
    assert answer(GREP, {"pattern": "x"}, grep_result=under).content == "c.py"


def test_grep_error_variant() -> None:
    result = agent.GrepResult(error=agent.GrepError(error="regex parse error: unclosed group"))
    outcome = answer(GREP, {"pattern": "("}, grep_result=result)
    assert outcome.content == "Search failed: regex parse error: unclosed group"
    assert outcome.is_error
    assert card(outcome, "grep_tool_call").result == result


def test_grep_empty_and_wrong_results() -> None:
    empty = answer(GREP, {"pattern": "x"}, grep_result=agent.GrepResult())
    assert empty.content == "protocol error: grep_result carries no result" and empty.is_error
    wrong = answer(GREP, {"pattern": "x"}, read_result=agent.ReadResult())
    assert wrong.content == "protocol error: expected grep_result, got read_result" and wrong.is_error
    assert card(wrong, "grep_tool_call").result == agent.GrepResult(
        error=agent.GrepError(error=wrong.content)
    )


# --- Glob --------------------------------------------------------------------------------------


def test_glob_parse() -> None:
    assert GLOB.parse({"glob_pattern": "**/*.py"}) == {"glob_pattern": "**/*.py", "target_directory": None}
    assert (
        GLOB.parse({"glob_pattern": "*.md", "target_directory": "/w/docs"})["target_directory"] == "/w/docs"
    )
    assert parse_error(GLOB, {}) == "missing required argument 'glob_pattern'"
    assert parse_error(GLOB, {"glob_pattern": ""}) == "argument 'glob_pattern' must not be empty"
    assert parse_error(GLOB, {"glob_pattern": 1}) == "argument 'glob_pattern' must be a string, got int"
    assert parse_error(GLOB, {"glob_pattern": "*", "target_directory": 2}) == (
        "argument 'target_directory' must be a string, got int"
    )


def test_glob_runs_as_a_files_only_grep() -> None:
    _, (field, exec_args) = start(GLOB, {"glob_pattern": "*.ts", "target_directory": "/w/web"})
    assert field == "grep_args"
    assert exec_args == agent.GrepArgs(
        pattern="", glob="*.ts", path="/w/web", output_mode="files_with_matches", tool_call_id=CALL_ID
    )
    assert GLOB.ui(GLOB.parse({"glob_pattern": "*.ts"})) == agent.GlobToolCall(
        args=agent.GlobToolArgs(glob_pattern="*.ts")
    )


def test_glob_lists_files() -> None:
    result = success(files("/w/web/a.ts", "/w/web/lib/b.ts"), path="/w/web")
    outcome = answer(GLOB, {"glob_pattern": "*.ts", "target_directory": "/w/web"}, grep_result=result)
    assert outcome.content == "/w/web/a.ts\n/w/web/lib/b.ts"
    assert not outcome.is_error
    record = card(outcome, "glob_tool_call")
    assert record.args == agent.GlobToolArgs(target_directory="/w/web", glob_pattern="*.ts")
    assert record.result.success == agent.GlobToolSuccess(
        pattern="*.ts", path="/w/web", files=["/w/web/a.ts", "/w/web/lib/b.ts"], total_files=2
    )


def test_glob_no_files() -> None:
    outcome = answer(GLOB, {"glob_pattern": "*.rs", "target_directory": "/w"}, grep_result=success(files()))
    assert outcome.content == 'No files found matching "*.rs" in /w.'
    assert not outcome.is_error
    assert card(outcome, "glob_tool_call").result.success.files == []


def test_glob_truncated() -> None:
    result = success(agent.GrepUnionResult(files=agent.GrepFilesResult(files=["a"], total_files=900)))
    outcome = answer(GLOB, {"glob_pattern": "*"}, grep_result=result)
    assert outcome.content == "a\n\n[Showing 1 of 900 files; use a more specific pattern.]"
    assert card(outcome, "glob_tool_call").result.success.total_files == 900
    flagged = answer(GLOB, {"glob_pattern": "*"}, grep_result=success(files("a", client_truncated=True)))
    assert flagged.content.endswith(
        "[Results were truncated; narrow the search or page with head_limit and offset.]"
    )
    assert card(flagged, "glob_tool_call").result.success.client_truncated


def test_glob_error_and_protocol_errors() -> None:
    failed = answer(
        GLOB, {"glob_pattern": "["}, grep_result=agent.GrepResult(error=agent.GrepError(error="bad glob"))
    )
    assert failed.content == "File search failed: bad glob" and failed.is_error
    assert card(failed, "glob_tool_call").result == agent.GlobToolResult(
        error=agent.GlobToolError(error="File search failed: bad glob")
    )
    wrong = answer(GLOB, {"glob_pattern": "*"}, ls_result=agent.LsResult())
    assert wrong.content == "protocol error: expected grep_result, got ls_result" and wrong.is_error
    empty = answer(GLOB, {"glob_pattern": "*"}, grep_result=agent.GrepResult())
    assert empty.content == "protocol error: grep_result carries no result" and empty.is_error


# --- lifecycle ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "raw"), [(GREP, {"pattern": "x"}), (GLOB, {"glob_pattern": "*"})], ids=["Grep", "Glob"]
)
def test_throw_and_stream_close(tool: ToolDef, raw: Mapping[str, Any]) -> None:
    execution, _ = start(tool, raw)
    thrown = finished(execution.on_throw("rg not found"))
    assert thrown.content == "rg not found" and thrown.is_error
    assert card(thrown, tool.ui_field).args == tool.ui(tool.parse(raw)).args
    assert execution.on_stream_close() == []

    execution, _ = start(tool, raw)
    closed = finished(execution.on_stream_close())
    assert closed.content == CLOSED and closed.is_error
    assert execution.on_result(agent.ExecClientMessage(grep_result=success(files("a")))) == []

    execution, _ = start(tool, raw)
    assert not finished(
        execution.on_result(agent.ExecClientMessage(grep_result=success(files("a"))))
    ).is_error
    assert execution.on_stream_close() == []
    assert execution.on_throw("late") == []
