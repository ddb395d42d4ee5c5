from __future__ import annotations

from typing import Any

import betterproto2
import pytest

from byok.cursor.tools.base import Finish, Invocation, SendExec, ToolArgError, ToolDef, ToolOutcome, Update
from byok.cursor.tools.shell_tool import MODEL_OUTPUT_LIMIT, SHELL, CappedText, shell_tool
from byok.pb.agent import v1 as agent

CWD = "/ws"


def execution(tool: ToolDef = SHELL, **args: Any) -> Any:
    parsed = tool.parse({"command": "make test", "working_directory": CWD, **args})
    return tool.execute(Invocation("call-1", "Shell", "mc-1", parsed))


def event(**kw: Any) -> agent.ExecClientMessage:
    return agent.ExecClientMessage(id=1, exec_id="call-1", shell_stream=agent.ShellStream(**kw))


START = event(start=agent.ShellStreamStart())


def out(data: str) -> agent.ExecClientMessage:
    return event(stdout=agent.ShellStreamStdout(data=data))


def err(data: str) -> agent.ExecClientMessage:
    return event(stderr=agent.ShellStreamStderr(data=data))


def exit_(code: int = 0, **kw: Any) -> agent.ExecClientMessage:
    return event(exit=agent.ShellStreamExit(code=code, cwd=CWD, **kw))


def finished(actions: list[Any]) -> ToolOutcome:
    assert isinstance(actions[-1], Finish)
    return actions[-1].outcome


def shell_result(outcome: ToolOutcome) -> agent.ShellResult:
    assert outcome.ui.shell_tool_call is not None
    assert outcome.ui.shell_tool_call.result is not None
    return outcome.ui.shell_tool_call.result


def run(ex: Any, *events: agent.ExecClientMessage) -> list[Any]:
    ex.start()
    actions: list[Any] = []
    for e in events:
        actions += ex.on_result(e)
    return actions


# --- arguments and the exec ----------------------------------------------------------------


def test_exec_fields_exact() -> None:
    ex = execution(block_until_ms=5000, description="run tests", required_permissions=["full_network"])
    (action,) = ex.start()
    assert isinstance(action, SendExec)
    assert action.message == agent.ExecServerMessage(
        shell_stream_args=agent.ShellArgs(
            command="make test",
            working_directory=CWD,
            timeout=5000,
            tool_call_id="call-1",
            requested_sandbox_policy=agent.SandboxPolicy(
                type=agent.SandboxPolicyType.WORKSPACE_READWRITE, network_access=True
            ),
            file_output_threshold_bytes=40000,
            timeout_behavior=agent.TimeoutBehavior.BACKGROUND,
            hard_timeout=86400000,
            description="run tests",
            close_stdin=True,
        )
    )


@pytest.mark.parametrize(
    ("permissions", "policy"),
    [
        ([], None),
        (["all"], agent.SandboxPolicy(type=agent.SandboxPolicyType.INSECURE_NONE, network_access=True)),
        (
            ["full_network", "all"],
            agent.SandboxPolicy(type=agent.SandboxPolicyType.INSECURE_NONE, network_access=True),
        ),
    ],
)
def test_sandbox_policy_from_permissions(permissions: list[str], policy: agent.SandboxPolicy | None) -> None:
    (action,) = execution(required_permissions=permissions).start()
    args = action.message.shell_stream_args
    assert args.requested_sandbox_policy == policy
    assert args.timeout == 30000  # the default block_until_ms
    assert args.description is None


@pytest.mark.parametrize(("given", "expected"), [(2.0, 2), (0, 0), (None, 30000), (120000, 120000)])
def test_block_until_ms_accepted(given: Any, expected: int) -> None:
    assert SHELL.parse({"command": "x", "block_until_ms": given})["block_until_ms"] == expected


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"command": "x", "block_until_ms": -1}, "must be >= 0"),
        ({"command": "x", "block_until_ms": "x"}, "must be an integer"),
        ({"command": "x", "block_until_ms": 2.5}, "must be an integer"),
        ({"command": "x", "block_until_ms": True}, "must be an integer"),
        ({}, "missing required argument 'command'"),
        ({"command": ""}, "must not be empty"),
        ({"command": "x", "required_permissions": ["network"]}, "unknown permission 'network'"),
        ({"command": "x", "required_permissions": "all"}, "list of strings"),
        ({"command": "x", "working_directory": 3}, "must be a string"),
    ],
)
def test_invalid_arguments(args: dict[str, Any], problem: str) -> None:
    with pytest.raises(ToolArgError, match=problem):
        SHELL.parse(args)


def test_ui_records() -> None:
    assert SHELL.placeholder() == agent.ShellToolCall()
    args = SHELL.parse({"command": "ls", "description": "list"})
    card = SHELL.tool_call(SHELL.ui(args)).shell_tool_call
    assert card == agent.ShellToolCall(
        args=agent.ShellArgs(command="ls", working_directory="", description="list"), description="list"
    )


# --- the stream ----------------------------------------------------------------------------


def test_stream_sequence() -> None:
    ex = execution()
    ex.start()
    (start,) = ex.on_result(START)
    assert isinstance(start, Update) and start.update.shell_output_delta.start == agent.ShellStreamStart()

    card, terminal = ex.on_result(out("hello\n"))
    assert card.update.tool_call_delta == agent.ToolCallDeltaUpdate(
        call_id="call-1",
        model_call_id="mc-1",
        tool_call_delta=agent.ToolCallDelta(
            shell_tool_call_delta=agent.ShellToolCallDelta(
                stdout=agent.ShellToolCallStdoutDelta(content="hello\n")
            )
        ),
    )
    assert terminal.update.shell_output_delta == agent.ShellOutputDeltaUpdate(
        stdout=agent.ShellStreamStdout(data="hello\n")
    )
    card, terminal = ex.on_result(err("warn\n"))
    assert card.update.tool_call_delta.tool_call_delta.shell_tool_call_delta.stderr.content == "warn\n"
    assert terminal.update.shell_output_delta.stderr.data == "warn\n"
    assert ex.on_result(out("")) == []

    echo, done = ex.on_result(exit_(0, local_execution_time_ms=42))
    assert echo.update.shell_output_delta.exit.code == 0
    outcome = finished([done])
    assert outcome.is_error is False
    assert outcome.content == "Exit code: 0\nWorking directory: /ws\n\nhello\nwarn\n"
    result = shell_result(outcome)
    assert betterproto2.which_one_of(result, "result")[0] == "success"
    assert (result.success.stdout, result.success.stderr) == ("hello\n", "warn\n")
    assert result.success.interleaved_output == "hello\nwarn\n"
    assert (result.success.exit_code, result.success.execution_time) == (0, 42)
    assert outcome.ui.shell_tool_call.args.tool_call_id == "call-1"
    assert ex.on_stream_close() == []
    assert ex.on_result(out("late")) == []


def test_nonzero_exit_is_a_normal_result() -> None:
    outcome = finished(run(execution(), START, err("boom\n"), exit_(2)))
    assert outcome.is_error is False
    assert outcome.content.startswith("Exit code: 2\n")
    result = shell_result(outcome)
    assert result.failure is not None and result.failure.exit_code == 2
    assert result.failure.stderr == "boom\n"


def test_no_output_and_output_location() -> None:
    location = agent.OutputLocation(file_path="/tmp/out.txt", size_bytes=50000, line_count=900)
    outcome = finished(run(execution(), START, exit_(0, output_location=location)))
    assert outcome.content == (
        "Exit code: 0\nWorking directory: /ws\n"
        "Full output (900 lines, 50000 bytes) was written to /tmp/out.txt\n\n(no output)"
    )
    assert shell_result(outcome).success.output_location == location


def test_aborted_exit_is_an_error() -> None:
    msg = exit_(130, aborted=True, abort_reason=agent.ShellAbortReason.USER_ABORT)
    outcome = finished(run(execution(), START, out("partial"), msg))
    assert outcome.is_error
    assert "The command was aborted by the user." in outcome.content
    assert shell_result(outcome).failure.aborted


def test_backgrounded() -> None:
    ex = execution(shell_tool(terminals_folder="/home/u/.cursor/terminals"), block_until_ms=0)
    bg = agent.ShellStreamBackgrounded(
        shell_id=7,
        command="make test",
        working_directory=CWD,
        pid=4242,
        reason=agent.ShellBackgroundReason.TIMEOUT,
    )
    outcome = finished(run(ex, START, out("compiling\n"), event(backgrounded=bg)))
    assert outcome.is_error is False
    assert outcome.content.startswith(
        "The command is still running in the background (shell id 7, pid 4242)."
    )
    assert "/home/u/.cursor/terminals" in outcome.content
    assert outcome.content.endswith("Output so far:\ncompiling\n")
    result = shell_result(outcome)
    assert (result.is_background, result.pid, result.terminals_folder) == (
        True,
        4242,
        "/home/u/.cursor/terminals",
    )
    assert (result.success.shell_id, result.success.pid) == (7, 4242)
    assert ex.on_stream_close() == []


def test_rejected_and_permission_denied() -> None:
    rejected = agent.ShellRejected(command="make test", working_directory=CWD, reason="not allowed")
    outcome = finished(run(execution(), event(rejected=rejected)))
    assert outcome.is_error and outcome.content == "Error: the user rejected the command: not allowed"
    assert shell_result(outcome).rejected == rejected

    denied = agent.ShellPermissionDenied(command="make test", working_directory=CWD, error="EPERM")
    outcome = finished(run(execution(), event(permission_denied=denied)))
    assert outcome.is_error and outcome.content == "Error: permission denied running the command: EPERM"
    assert shell_result(outcome).permission_denied == denied


def test_output_cap_keeps_head_and_tail() -> None:
    ex = execution()
    chunk = "x" * 999 + "\n"
    outcome = finished(run(ex, START, out("HEAD\n"), *[out(chunk)] * 100, out("TAIL\n"), exit_(0)))
    body = outcome.content.split("\n\n", 1)[1]
    assert body.startswith("HEAD\n") and body.endswith("TAIL\n")
    total = 5 + 100 * 1000 + 5
    assert f"[{total - MODEL_OUTPUT_LIMIT} characters omitted]" in body
    assert len(body) < MODEL_OUTPUT_LIMIT + 100


def test_capped_text() -> None:
    c = CappedText(10)
    for piece in ["abc", "defgh", "ij"]:
        c.add(piece)
    assert c.text() == "abcdefghij"
    c.add("KLMNOP")
    assert c.text() == "abcde\n... [6 characters omitted] ...\nLMNOP"
    for _ in range(100):
        c.add("z" * 7)
    assert c.text().endswith("\nzzzzz") and c.total == 16 + 700


# --- failures ------------------------------------------------------------------------------


def test_stream_close_before_exit() -> None:
    ex = execution()
    outcome = finished(run(ex, START, out("so far\n")) + ex.on_stream_close())
    assert outcome.is_error
    assert (
        outcome.content
        == "Error: shell stream closed before the command finished\n\nOutput so far:\nso far\n"
    )
    assert shell_result(outcome).failure.aborted
    assert ex.on_stream_close() == []


def test_stream_close_before_start_and_throw() -> None:
    ex = execution()
    ex.start()
    outcome = finished(ex.on_stream_close())
    assert outcome.content == "Error: shell stream closed before the command finished"
    assert shell_result(outcome).spawn_error.error == "shell stream closed before the command finished"

    ex = execution()
    ex.start()
    outcome = finished(ex.on_throw("no terminal"))
    assert outcome.is_error and outcome.content == "Error: no terminal"
    assert ex.on_throw("again") == []


def test_wrong_result_type_and_unknown_event() -> None:
    ex = execution()
    ex.start()
    assert ex.on_result(event()) == []  # an event this version does not know: keep waiting
    wrong = agent.ExecClientMessage(id=1, shell_result=agent.ShellResult())
    outcome = finished(ex.on_result(wrong))
    assert outcome.is_error
    assert outcome.content == "Error: protocol error: expected shell_stream, got shell_result"
