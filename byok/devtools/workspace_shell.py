"""Shell execs: a real ``/bin/sh`` per ``shell_stream_args``, its output streamed back as it
arrives. A command still running past its timeout is killed, or with BACKGROUND left running
under a shell id (Cursor keeps its output in a terminal file)."""

from __future__ import annotations

import codecs
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

from byok.devtools.exec_client import PendingExec, Reply, exec_result, stream_close
from byok.pb.agent import v1 as agent

if TYPE_CHECKING:
    from byok.devtools.sim_terminals import TerminalFiles

Events = tuple[str, str]  # ("stdout" | "stderr", decoded text)


@attrs.define(eq=False)
class Shell:
    """A running command. Its pumps queue output for the exec streaming it or, once it is
    backgrounded, keep it in ``output`` (Cursor writes it to a terminal file)."""

    command: str
    cwd: Path
    process: trio.Process
    backgrounded: bool = False
    output: list[Events] = attrs.Factory(list)
    printed: list[str] = attrs.Factory(list)  # everything it printed, in order (its terminal's text)
    # Once backgrounded with a terminal file (devtools/sim_terminals.py): where new output goes.
    on_output: Callable[[str], None] | None = None
    pumps_open: int = 2
    drained: trio.Event = attrs.Factory(trio.Event)  # both pipes reached EOF

    def emit(self, events: trio.MemorySendChannel[Events], kind: str, text: str) -> None:
        if not text:
            return
        self.printed.append(text)
        if self.backgrounded and self.on_output is not None:
            self.on_output(text)
        try:
            if not self.backgrounded:
                events.send_nowait((kind, text))
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the exec stopped listening (it was cancelled)
        self.output.append((kind, text))

    def kill(self) -> None:
        # The command leads its own session: killing the group also stops its children, which
        # would otherwise keep the pipes open.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


async def _pump(
    shell: Shell, stream: trio.abc.ReceiveStream, kind: str, events: trio.MemorySendChannel[Events]
) -> None:
    # Runs as a system task: a backgrounded shell outlives the exec and the run that started
    # it, so neither one's nursery can own the drain. Ends at EOF or when trio.run ends.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while data := await stream.receive_some(65536):
            shell.emit(events, kind, decoder.decode(data))
        shell.emit(events, kind, decoder.decode(b"", final=True))
    except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        pass
    finally:
        events.close()
        shell.pumps_open -= 1
        if shell.pumps_open == 0:
            shell.drained.set()


class Shells:
    """The workspace's shell processes: every live one, foreground ones included, and the
    backgrounded ones by shell id."""

    def __init__(self, timeout_cap_s: float, terminals: TerminalFiles | None = None) -> None:
        self.timeout_cap_s = timeout_cap_s
        self.terminals = terminals  # Cursor's terminal files for backgrounded shells, when kept
        self.background: dict[int, Shell] = {}  # shell_id -> backgrounded shell
        self._foreground: dict[str, trio.CancelScope] = {}  # tool call id -> a running exec's wait
        self._forced: set[str] = set()  # tool call ids the user moved to the background
        self._live: set[Shell] = set()
        self._next_shell_id = 1

    async def aclose(self) -> None:
        """Kill every process still running (backgrounded shells included) and reap them."""
        shells = list(self._live)
        for shell in shells:
            shell.kill()
        with trio.move_on_after(5):
            for shell in shells:
                await shell.process.wait()
                self._live.discard(shell)
        self.background.clear()

    async def run(
        self,
        msg: agent.ExecServerMessage,
        args: agent.ShellArgs,
        reply: Reply,
        pending: PendingExec,
        *,
        cwd: Path | None,
        root: Path,
    ) -> None:
        """Run one shell exec in ``cwd`` (None: outside ``root``) and stream its events."""

        def event(**ev: object) -> agent.AgentClientMessage:
            return exec_result(msg, shell_stream=agent.ShellStream(**ev))  # type: ignore[arg-type]

        async def forward(kind: str, text: str) -> None:
            out = (
                agent.ShellStreamStdout(data=text) if kind == "stdout" else agent.ShellStreamStderr(data=text)
            )
            await reply(event(**{kind: out}))

        if pending.aborted or cwd is None or not cwd.is_dir():
            if pending.aborted:  # aborted while delayed: it never started
                await reply(event(exit=agent.ShellStreamExit(cwd=str(cwd or root), aborted=True)))
            else:
                reason = "outside the workspace" if cwd is None else "no such directory"
                denied = agent.ShellPermissionDenied(
                    command=args.command, working_directory=args.working_directory, error=reason
                )
                await reply(event(permission_denied=denied))
            await reply(stream_close(msg.id))
            return

        await reply(event(start=agent.ShellStreamStart()))
        started = time.monotonic()
        send, receive = trio.open_memory_channel[Events](float("inf"))
        process = await trio.lowlevel.open_process(
            ["/bin/sh", "-c", args.command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        shell = Shell(args.command, cwd, process)
        self._live.add(shell)
        assert process.stdout is not None and process.stderr is not None
        # Each pump holds its own clone, so the channel ends when both pipes reach EOF.
        trio.lowlevel.spawn_system_task(_pump, shell, process.stdout, "stdout", send.clone())
        trio.lowlevel.spawn_system_task(_pump, shell, process.stderr, "stderr", send.clone())
        send.close()

        timeout_s = self.timeout_cap_s
        if args.timeout > 0:
            timeout_s = min(args.timeout / 1000, timeout_s)
        try:
            with trio.CancelScope(deadline=trio.current_time() + timeout_s) as scope:
                pending.scope = scope
                self._foreground[msg.exec_id] = scope  # the user may move it to the background
                if pending.aborted:
                    scope.cancel()
                async for kind, text in receive:
                    # Never cut an append in half: the sim's seqno must match what the server saw.
                    with trio.CancelScope(shield=True):
                        await forward(kind, text)
                await process.wait()
            pending.scope = None
            self._foreground.pop(msg.exec_id, None)
            forced = msg.exec_id in self._forced
            self._forced.discard(msg.exec_id)
            exit_: agent.ShellStreamExit | None = agent.ShellStreamExit(cwd=str(cwd))
            if not scope.cancelled_caught:
                exit_.code = _exit_code(process.returncode)
            elif not pending.aborted and (
                forced or args.timeout_behavior == agent.TimeoutBehavior.BACKGROUND
            ):
                shell.backgrounded = True  # from now on the pumps keep its output
                for kind, text in _queued(receive):  # output from before the timeout is this exec's
                    await forward(kind, text)
                backgrounded = self._register_background(shell)
                if forced:
                    backgrounded.reason = agent.ShellBackgroundReason.USER_REQUEST
                await reply(event(backgrounded=backgrounded))
                exit_ = None
            else:
                assert exit_ is not None
                shell.kill()
                with trio.move_on_after(2):  # what it printed before dying, then its status
                    async for kind, text in receive:
                        await forward(kind, text)
                    await process.wait()
                exit_.code, exit_.aborted = _exit_code(process.returncode), True
                exit_.abort_reason = (
                    agent.ShellAbortReason.USER_ABORT if pending.aborted else agent.ShellAbortReason.TIMEOUT
                )
            if exit_ is not None:
                exit_.local_execution_time_ms = int((time.monotonic() - started) * 1000)
                await reply(event(exit=exit_))
            await reply(stream_close(msg.id))
        finally:
            receive.close()
            if not shell.backgrounded:  # done, or cancelled from outside: leave nothing behind
                shell.kill()
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await process.wait()
                self._live.discard(shell)

    def force_background(self, tool_call_id: str) -> bool:
        """force_background_shell_args: move the running shell of this call to the background
        now (its stream ends ``backgrounded``); False when no such shell is running."""
        scope = self._foreground.get(tool_call_id)
        if scope is None:
            return False
        self._forced.add(tool_call_id)
        scope.cancel()
        return True

    def _register_background(self, shell: Shell) -> agent.ShellStreamBackgrounded:
        shell_id = self._next_shell_id
        self._next_shell_id += 1
        self.background[shell_id] = shell
        if self.terminals is not None:
            self.terminals.background(shell_id, shell)
        return agent.ShellStreamBackgrounded(
            shell_id=shell_id,
            command=shell.command,
            working_directory=str(shell.cwd),
            pid=shell.process.pid,
            reason=agent.ShellBackgroundReason.TIMEOUT,
        )


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N -> 128+N


def _queued(receive: trio.MemoryReceiveChannel[Events]) -> list[Events]:
    out = []
    while True:
        try:
            out.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out
