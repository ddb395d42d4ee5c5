"""AwaitShell: wait for a backgrounded shell by reading its terminal file (server-local).

A Shell that outlives its ``block_until_ms`` is moved to the background by Cursor, which keeps
writing its output to ``<terminals_folder>/<shell_id>.txt`` (seeds 000 §29). byok runs on the
user's machine, so it reads that file itself: the call asks the run for server work
(``TerminalWait``), which polls the file until the command ends, the pattern matches or
``block_until_ms`` is up, and hands back what it saw (``TerminalWaited``). Without a shell id
the call only waits. The card is Cursor's ``await_tool_call`` (seeds 000 §26.13: AWAIT).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from byok.cursor.tools.base import (
    Action,
    Invocation,
    Phased,
    StartWork,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_int,
    optional_text,
)
from byok.pb.agent import v1 as agent

DEFAULT_BLOCK_UNTIL_MS = 30_000
MAX_BLOCK_UNTIL_MS = 600_000  # a call holds its round: ten minutes at most, then poll again
_SHELL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a file name in the terminals folder, never a path


@attrs.frozen
class TerminalWait:
    """Server work: watch ``path`` (empty: just wait) for ``block_until_ms``."""

    path: str
    block_until_ms: int
    pattern: str | None = None


@attrs.frozen
class TerminalWaited:
    """What the watch saw when it stopped (``missing``: there was no such file)."""

    waited_ms: int
    missing: bool = False
    output_length: int = 0
    tail: str = ""
    omitted: int = 0
    ended: bool = False
    exit_code: int | None = None
    error: str = ""
    elapsed_ms: int | None = None
    match: str | None = None


def _parse(args: Mapping[str, Any]) -> Mapping[str, Any]:
    raw_id = args.get("shell_id")
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        raw_id = str(raw_id)  # Shell reports shell ids as numbers
    shell_id = optional_text({"shell_id": raw_id}, "shell_id")
    if shell_id is not None and not _SHELL_ID.match(shell_id):
        raise ToolArgError(f"shell_id '{shell_id}' is not a shell id (the number Shell gave back)")
    block = optional_int(args, "block_until_ms", minimum=0)
    block = DEFAULT_BLOCK_UNTIL_MS if block is None else min(block, MAX_BLOCK_UNTIL_MS)
    if shell_id is None and block == 0:
        raise ToolArgError("shell_id is required when block_until_ms is 0 (there is nothing to check)")
    pattern = optional_text(args, "pattern")
    if pattern is not None:
        if shell_id is None:
            raise ToolArgError("a pattern needs the shell_id whose output it is matched against")
        try:
            re.compile(pattern, re.MULTILINE)
        except re.error as e:
            raise ToolArgError(f"pattern is not a valid regular expression: {e}") from None
    return {"shell_id": shell_id, "block_until_ms": block, "pattern": pattern}


def _await_args(args: Mapping[str, Any]) -> agent.AwaitArgs:
    return agent.AwaitArgs(
        task_id=args["shell_id"] or "", block_until_ms=args["block_until_ms"], regex=args["pattern"]
    )


def _ui(args: Mapping[str, Any]) -> agent.AwaitToolCall:
    return agent.AwaitToolCall(args=_await_args(args))


def terminal_path(folder: str, shell_id: str) -> str:
    return f"{folder.rstrip('/')}/{shell_id}.txt"


class AwaitShellExecution(Phased):
    def __init__(self, inv: Invocation) -> None:
        self._inv = inv
        self._args = inv.args
        self._path = ""

    def start(self) -> list[Action]:
        shell_id: str | None = self._args["shell_id"]
        if shell_id is not None:
            folder = "" if self._inv.env is None else self._inv.env.terminals_folder
            if not folder:
                return self.fail(
                    "Cursor did not say where its terminal files are (no terminals folder in the"
                    " request), so byok cannot read the shell's output"
                )
            self._path = terminal_path(folder, shell_id)
        return [StartWork(TerminalWait(self._path, self._args["block_until_ms"], self._args["pattern"]))]

    def on_work(self, result: Any) -> list[Action]:
        if self.done:
            return []
        if not isinstance(result, TerminalWaited):
            return self.fail(f"protocol error: unexpected work result {type(result).__name__}")
        shell_id: str | None = self._args["shell_id"]
        if shell_id is None:
            return self._finish(f"Waited {result.waited_ms} ms.", _still_running("", result, "", False))
        if result.missing:
            return self.fail(
                f"shell {shell_id} has no terminal file ({self._path}); check the shell id Shell gave back"
            )
        return self._report(shell_id, result)

    def _report(self, shell_id: str, r: TerminalWaited) -> list[Action]:
        pattern: str | None = self._args["pattern"]
        if r.ended and r.error:
            head = f"Shell {shell_id} could not run: {r.error}"
        elif r.ended:
            code = "an unknown exit code" if r.exit_code is None else f"exit code {r.exit_code}"
            head = f"Shell {shell_id} has finished with {code}."
        else:
            head = f"Shell {shell_id} is still running (waited {r.waited_ms} ms)."
        lines = [head]
        if pattern is not None:
            lines.append(
                f"The pattern {pattern!r} matched: {r.match!r}"
                if r.match is not None
                else f"The pattern {pattern!r} did not match its output."
            )
        lines.append(f"Output file: {self._path} ({r.output_length} bytes of output)")
        if r.output_length:
            cut = (
                f" (the last {len(r.tail.encode())} bytes; {r.omitted} before them omitted)"
                if r.omitted
                else ""
            )
            lines += ["", f"Output{cut}:", r.tail]
        else:
            lines += ["", "No output yet."]
        if r.ended:
            done = agent.AwaitTaskComplete(
                task_id=shell_id,
                runtime_ms=r.elapsed_ms if r.elapsed_ms is not None else r.waited_ms,
                output_file_path=self._path,
                output_length=r.output_length,
                regex_requested=pattern is not None,
                regex_match=r.match,
                exit_code=r.exit_code,
            )
            result = agent.AwaitResult(success=agent.AwaitSuccess(complete=done))
        else:
            result = _still_running(shell_id, r, self._path, pattern is not None)
        return self._finish("\n".join(lines), result)

    def _finish(self, content: str, result: agent.AwaitResult) -> list[Action]:
        card = agent.AwaitToolCall(args=_await_args(self._args), result=result)
        return self.finish(
            ToolOutcome(content=content, is_error=False, ui=agent.ToolCall(await_tool_call=card))
        )

    def fail(self, message: str) -> list[Action]:
        card = agent.AwaitToolCall(
            args=_await_args(self._args), result=agent.AwaitResult(error=agent.AwaitError(error=message))
        )
        outcome = ToolOutcome(
            content=f"Error: {message}", is_error=True, ui=agent.ToolCall(await_tool_call=card)
        )
        return self.finish(outcome)


def _still_running(shell_id: str, r: TerminalWaited, path: str, regex: bool) -> agent.AwaitResult:
    running = agent.AwaitTaskStillRunning(
        task_id=shell_id,
        runtime_ms=r.waited_ms,
        output_file_path=path,
        output_length=r.output_length,
        regex_requested=regex,
        regex_match=r.match,
    )
    return agent.AwaitResult(success=agent.AwaitSuccess(still_running=running))


AWAIT_SHELL = ToolDef(
    name="AwaitShell",
    ui_field="await_tool_call",
    placeholder=agent.AwaitToolCall,
    parse=_parse,
    ui=_ui,
    execute=AwaitShellExecution,
    transport="local",
)

TOOLS: tuple[ToolDef, ...] = (AWAIT_SHELL,)
