"""A command the user ran from Cursor's chat (``shell_command_action``): a turn of its own.

Cursor asks byok to run it (the action names the command and the exec id to run it under): byok
sends one ``shell_stream_args`` Exec, as for a Shell call, and the client's terminal view gets
its ``shell_output_delta`` events (no tool card: no model asked for it). When it ends, the
command and what it printed are committed as a runtime message, so the model sees them in the
next turn, and the checkpoint lists a ``ShellConversationTurnStructure`` (the command and its
output, each a blob) after the conversation's turns. The run calls no model.
"""

from __future__ import annotations

from typing import Any

import attrs

from byok.cursor import encode
from byok.cursor.checkpoint import Blob
from byok.cursor.tools.base import Action, Finish, Invocation, ToolOutcome, Update
from byok.cursor.tools.shell_tool import ShellExecution
from byok.pb.agent import v1 as agent

# The user's command may run long (a build): it gets ten minutes in the foreground, then moves
# to the background like a Shell call would.
FOREGROUND_MS = 600_000


@attrs.frozen
class UserCommand:
    command: str
    exec_id: str  # the Exec's exec_id Cursor chose for it


def user_command(action: agent.ConversationAction | None, request_id: str) -> UserCommand:
    value = None if action is None else action.shell_command_action
    command = "" if value is None or value.shell_command is None else value.shell_command.command
    return UserCommand(command, (value.exec_id if value is not None else "") or f"user-shell:{request_id}")


class UserShellExecution(ShellExecution):
    """A Shell execution whose output feeds Cursor's terminal view only (there is no card), and
    whose result text is what the model reads of the command (a runtime message)."""

    def _output(self, stream: str, data: str) -> list[Action]:
        return [a for a in super()._output(stream, data) if not _is_card_delta(a)]

    def _finish(self, content: str, is_error: bool, result: agent.ShellResult) -> Finish:
        text = f"The user ran a command in the shell:\n$ {self._args['command']}\n{content}"
        return super()._finish(text, is_error, result)


def _is_card_delta(action: Action) -> bool:
    return isinstance(action, Update) and action.update.tool_call_delta is not None


def execution(cmd: UserCommand, env: Any) -> UserShellExecution:
    args = {
        "command": cmd.command,
        "working_directory": "",
        "block_until_ms": FOREGROUND_MS,
        "description": None,
        "required_permissions": [],
    }
    inv = Invocation(cmd.exec_id, "user_shell", "", args, env)
    return UserShellExecution(inv, "" if env is None else env.terminals_folder)


@attrs.frozen
class ShellOutput:
    stdout: str
    stderr: str
    exit_code: int

    def encode(self) -> bytes:
        """agent.v1.ShellOutput{stdout = 1, stderr = 2, int32 exit_code = 3}: not in byok's proto
        subset, so written here (proto3: empty fields are left out)."""
        out = b""
        for number, text in ((1, self.stdout), (2, self.stderr)):
            if text:
                data = text.encode()
                out += bytes([number << 3 | 2]) + encode.varint(len(data)) + data
        if self.exit_code:
            out += b"\x18" + encode.varint(self.exit_code & 0xFFFFFFFFFFFFFFFF)  # int32: two's complement
        return out


def shell_output(outcome: ToolOutcome) -> ShellOutput:
    shell = outcome.ui.shell_tool_call
    result = None if shell is None else shell.result
    ran = None if result is None else (result.success or result.failure)
    if ran is None:  # it could not run: what went wrong is its output
        return ShellOutput("", outcome.content, -1)
    return ShellOutput(ran.stdout or "", ran.stderr or "", getattr(ran, "exit_code", 0) or 0)


def shell_turn(cmd: UserCommand, outcome: ToolOutcome) -> tuple[Blob, Blob, Blob]:
    """The turn's blobs: the ShellCommand, the ShellOutput, and the structure listing both."""
    command = Blob.of(bytes(agent.ShellCommand(command=cmd.command)))
    output = Blob.of(shell_output(outcome).encode())
    structure = Blob.of(
        bytes(
            agent.ConversationTurnStructure(
                shell_conversation_turn=agent.ShellConversationTurnStructure(
                    shell_command=command.id, shell_output=output.id
                )
            )
        )
    )
    return command, output, structure
