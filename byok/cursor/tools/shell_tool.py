"""Shell: one ``shell_stream_args`` exec whose events stream back on the same exec id.

The client answers with ``shell_stream`` events: ``start``, any number of ``stdout``/``stderr``,
then ``exit`` — or ``backgrounded`` when the command outlives ``block_until_ms`` (we always ask
for ``timeout_behavior=BACKGROUND``), or ``rejected``/``permission_denied`` instead of running.
Every output event is sent twice: as a ``shell_tool_call_delta`` for the tool card and, as the
protocol echoes every shell event, as a ``shell_output_delta`` for Cursor's terminal view.
Output reaches the model as the client sent it (no newline normalisation: a progress bar's CRs
are not line breaks), capped to its head and tail.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    Update,
    optional_int,
    optional_str,
    require_str,
    string_list,
)
from byok.pb.agent import v1 as agent

DEFAULT_BLOCK_UNTIL_MS = 30_000
HARD_TIMEOUT_MS = 86_400_000  # a backgrounded command is killed after a day
FILE_OUTPUT_THRESHOLD_BYTES = 40_000  # beyond this the client spills output to a file
MODEL_OUTPUT_LIMIT = 30_000  # characters of output the model sees (head and tail)

_PERMISSIONS = ("full_network", "all")


class CappedText:
    """Text accumulated in chunks, keeping at most ``limit`` characters: the head and the tail.

    A long build log matters at both ends (what ran, how it ended); the middle is dropped and
    ``text()`` says how much. Memory stays bounded however much the command prints.
    """

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = ""
        self._tail: list[str] = []
        self._tail_len = 0
        self.total = 0

    def add(self, chunk: str) -> None:
        self.total += len(chunk)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_len += len(chunk)
        if self._tail_len > 2 * self._tail_limit:  # trim in batches, not on every chunk
            kept = "".join(self._tail)[-self._tail_limit :]
            self._tail, self._tail_len = [kept], len(kept)

    def text(self) -> str:
        tail = "".join(self._tail)[-self._tail_limit :]
        omitted = self.total - len(self._head) - len(tail)
        if omitted <= 0:
            return self._head + tail
        return f"{self._head}\n... [{omitted} characters omitted] ...\n{tail}"


def _parse(args: Mapping[str, Any]) -> Mapping[str, Any]:
    permissions = string_list(args, "required_permissions")
    for p in permissions:
        if p not in _PERMISSIONS:
            raise ToolArgError(f"required_permissions: unknown permission '{p}' (use full_network or all)")
    block = optional_int(args, "block_until_ms", minimum=0)
    return {
        "command": require_str(args, "command"),
        "working_directory": optional_str(args, "working_directory") or "",
        "block_until_ms": DEFAULT_BLOCK_UNTIL_MS if block is None else block,
        "description": optional_str(args, "description"),
        "required_permissions": permissions,
    }


def sandbox_policy(permissions: list[str]) -> agent.SandboxPolicy | None:
    """The sandbox that ``required_permissions`` asks for; none asked -> unset (the client's default)."""
    if "all" in permissions:
        return agent.SandboxPolicy(type=agent.SandboxPolicyType.INSECURE_NONE, network_access=True)
    if "full_network" in permissions:
        return agent.SandboxPolicy(type=agent.SandboxPolicyType.WORKSPACE_READWRITE, network_access=True)
    return None


def shell_exec_args(args: Mapping[str, Any], tool_call_id: str) -> agent.ShellArgs:
    return agent.ShellArgs(
        command=args["command"],
        working_directory=args["working_directory"],
        timeout=args["block_until_ms"],
        tool_call_id=tool_call_id,
        requested_sandbox_policy=sandbox_policy(args["required_permissions"]),
        file_output_threshold_bytes=FILE_OUTPUT_THRESHOLD_BYTES,
        timeout_behavior=agent.TimeoutBehavior.BACKGROUND,
        hard_timeout=HARD_TIMEOUT_MS,
        description=args["description"],
        close_stdin=True,
    )


def _ui_args(args: Mapping[str, Any], tool_call_id: str = "") -> agent.ShellArgs:
    # The card only needs what the model asked for; the exec's policy knobs stay off it.
    return agent.ShellArgs(
        command=args["command"],
        working_directory=args["working_directory"],
        tool_call_id=tool_call_id,
        description=args["description"],
    )


def _ui(args: Mapping[str, Any]) -> agent.ShellToolCall:
    return agent.ShellToolCall(args=_ui_args(args), description=args["description"])


class ShellExecution:
    def __init__(self, inv: Invocation, terminals_folder: str = "") -> None:
        self._inv = inv
        self._args = inv.args
        self._terminals_folder = terminals_folder
        self._started = False
        self._done = False
        self._sandbox: agent.SandboxPolicy | None = sandbox_policy(inv.args["required_permissions"])
        self._stdout = CappedText(MODEL_OUTPUT_LIMIT)
        self._stderr = CappedText(MODEL_OUTPUT_LIMIT)
        self._combined = CappedText(MODEL_OUTPUT_LIMIT)  # in arrival order, what a terminal shows

    def start(self) -> list[Action]:
        exec_args = shell_exec_args(self._args, self._inv.call_id)
        return [SendExec(agent.ExecServerMessage(shell_stream_args=exec_args))]

    def on_result(self, msg: agent.ExecClientMessage) -> list[Action]:
        if self._done:
            return []
        field, stream = betterproto2.which_one_of(msg, "message")
        if field != "shell_stream":
            return self._fail(f"protocol error: expected shell_stream, got {field or 'an empty message'}")
        event, value = betterproto2.which_one_of(stream, "event")
        if event == "start":
            self._started = True
            if value.sandbox_policy is not None:
                self._sandbox = value.sandbox_policy
            return [self._terminal(start=value)]
        if event in ("stdout", "stderr"):
            return self._output(event, value.data)
        if event == "exit":
            return [self._terminal(exit=value), self._finish_exit(value)]
        if event == "backgrounded":
            return [self._finish_backgrounded(value)]
        if event == "rejected":
            why = f": {value.reason}" if value.reason else ""
            text = f"Error: the user rejected the command{why}"
            return [self._finish(text, True, agent.ShellResult(rejected=value))]
        if event == "permission_denied":
            why = f": {value.error}" if value.error else ""
            text = f"Error: permission denied running the command{why}"
            return [self._finish(text, True, agent.ShellResult(permission_denied=value))]
        # An event this version does not know (newer clients add some): keep waiting for exit.
        return []

    def on_stream_close(self) -> list[Action]:
        if self._done:
            return []
        return self._fail("shell stream closed before the command finished")

    def on_throw(self, error: str) -> list[Action]:
        if self._done:
            return []
        return self._fail(error or "the client failed to run the command")

    # --- streaming ------------------------------------------------------------------------

    def _output(self, stream: str, data: str) -> list[Action]:
        if not data:
            return []
        self._combined.add(data)
        if stream == "stdout":
            self._stdout.add(data)
            card = agent.ShellToolCallDelta(stdout=agent.ShellToolCallStdoutDelta(content=data))
            terminal = self._terminal(stdout=agent.ShellStreamStdout(data=data))
        else:
            self._stderr.add(data)
            card = agent.ShellToolCallDelta(stderr=agent.ShellToolCallStderrDelta(content=data))
            terminal = self._terminal(stderr=agent.ShellStreamStderr(data=data))
        delta = agent.ToolCallDeltaUpdate(
            call_id=self._inv.call_id,
            tool_call_delta=agent.ToolCallDelta(shell_tool_call_delta=card),
            model_call_id=self._inv.model_call_id,
        )
        return [Update(agent.InteractionUpdate(tool_call_delta=delta)), terminal]

    def _terminal(self, **event: Any) -> Update:
        return Update(agent.InteractionUpdate(shell_output_delta=agent.ShellOutputDeltaUpdate(**event)))

    # --- terminal events ------------------------------------------------------------------

    def _finish_exit(self, exit_: agent.ShellStreamExit) -> Action:
        cwd = exit_.cwd or self._args["working_directory"]
        lines = [f"Exit code: {exit_.code}"]
        if cwd:
            lines.append(f"Working directory: {cwd}")
        if exit_.aborted:
            lines.append(f"The command was aborted{_abort_reason(exit_.abort_reason)}.")
        location = exit_.output_location
        if location is not None and location.file_path:
            lines.append(
                f"Full output ({location.line_count} lines, {location.size_bytes} bytes) "
                f"was written to {location.file_path}"
            )
        lines += ["", self._model_output()]
        common: dict[str, Any] = {
            "command": self._args["command"],
            "working_directory": cwd,
            "exit_code": exit_.code,
            "stdout": self._stdout.text(),
            "stderr": self._stderr.text(),
            "execution_time": exit_.local_execution_time_ms or 0,
            "output_location": location,
            "interleaved_output": self._combined.text(),
            "local_execution_time_ms": exit_.local_execution_time_ms,
        }
        if exit_.code == 0 and not exit_.aborted:
            result = agent.ShellResult(success=agent.ShellSuccess(**common))
        else:
            failure = agent.ShellFailure(**common, aborted=exit_.aborted, abort_reason=exit_.abort_reason)
            result = agent.ShellResult(failure=failure)
        # A non-zero exit is an ordinary result the model must read, not a tool error.
        return self._finish("\n".join(lines), exit_.aborted, result)

    def _finish_backgrounded(self, bg: agent.ShellStreamBackgrounded) -> Action:
        pid = f", pid {bg.pid}" if bg.pid is not None else ""
        where = f" ({self._terminals_folder})" if self._terminals_folder else ""
        lines = [
            f"The command is still running in the background (shell id {bg.shell_id}{pid}).",
            f"Its output keeps streaming to the terminal file of shell {bg.shell_id} "
            f"in the terminals folder{where}; read that file to check on it.",
            "",
            "Output so far:",
            self._model_output(),
        ]
        success = agent.ShellSuccess(
            command=self._args["command"],
            working_directory=bg.working_directory or self._args["working_directory"],
            stdout=self._stdout.text(),
            stderr=self._stderr.text(),
            interleaved_output=self._combined.text(),
            shell_id=bg.shell_id,
            pid=bg.pid,
            ms_to_wait=bg.ms_to_wait,
            background_reason=bg.reason,
        )
        result = agent.ShellResult(
            success=success,
            is_background=True,
            pid=bg.pid,
            terminals_folder=self._terminals_folder or None,
        )
        return self._finish("\n".join(lines), False, result)

    def _fail(self, message: str) -> list[Action]:
        command, cwd = self._args["command"], self._args["working_directory"]
        if self._started:
            # It ran but we will never see its end: show what it printed, marked aborted.
            failure = agent.ShellFailure(
                command=command,
                working_directory=cwd,
                exit_code=-1,
                stdout=self._stdout.text(),
                stderr=self._stderr.text(),
                interleaved_output=self._combined.text(),
                aborted=True,
            )
            result = agent.ShellResult(failure=failure)
            text = f"Error: {message}\n\nOutput so far:\n{self._model_output()}"
        else:
            spawn = agent.ShellSpawnError(command=command, working_directory=cwd, error=message)
            result = agent.ShellResult(spawn_error=spawn)
            text = f"Error: {message}"
        return [self._finish(text, True, result)]

    def _finish(self, content: str, is_error: bool, result: agent.ShellResult) -> Action:
        self._done = True
        if result.sandbox_policy is None:
            result.sandbox_policy = self._sandbox
        record = agent.ShellToolCall(
            args=_ui_args(self._args, self._inv.call_id),
            result=result,
            description=self._args["description"],
        )
        return Finish(
            ToolOutcome(content=content, is_error=is_error, ui=agent.ToolCall(shell_tool_call=record))
        )

    def _model_output(self) -> str:
        return self._combined.text() or "(no output)"


def _abort_reason(reason: agent.ShellAbortReason | None) -> str:
    if reason == agent.ShellAbortReason.USER_ABORT:
        return " by the user"
    if reason == agent.ShellAbortReason.TIMEOUT:
        return " after the hard timeout"
    return ""


def _terminals_of(inv: Invocation) -> str:
    return "" if inv.env is None else inv.env.terminals_folder


def shell_tool(terminals_folder: str = "") -> ToolDef:
    """The Shell tool. ``terminals_folder`` (RequestContextEnv.terminals_folder), when known,
    tells the model where a backgrounded command's output goes."""
    return ToolDef(
        name="Shell",
        ui_field="shell_tool_call",
        placeholder=agent.ShellToolCall,
        parse=_parse,
        ui=_ui,
        execute=lambda inv: ShellExecution(inv, terminals_folder or _terminals_of(inv)),
        args_stream=None,
    )


SHELL = shell_tool()


TOOLS: tuple[ToolDef, ...] = (SHELL,)
