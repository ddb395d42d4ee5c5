"""Run Exec requests against a real workspace folder, the way Cursor's client does.

The Cursor simulator hands every ExecServerMessage to a ``WorkspaceExecutor`` so integration
tests exercise tool rounds end to end: real files under ``root`` (workspace_files,
workspace_grep), a real ``/bin/sh`` for shell execs (workspace_shell). Nothing outside ``root``
is read, written or deleted (symlinks are resolved first).

Client message sequences (every ExecClientMessage carries the exec's id and exec_id):
  read / write / delete / grep / diagnostics: one ``*_result``, then control ``stream_close``.
  fetch_args: the URL fetched over HTTP (workspace_fetch), one ``fetch_result``, ``stream_close``.
  shell_stream_args: ``start``, ``stdout``/``stderr`` as output arrives, then ``exit`` (or
    ``backgrounded`` past the timeout with BACKGROUND, or when the server forces it with
    ``force_background_shell_args``, which is answered ACCEPTED or NOT_FOUND), then
    ``stream_close``.
  MCP execs: answered by the pretend MCP server given as ``mcp`` (devtools/sim_mcp.py).
  anything else: control ``throw``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import betterproto2
import trio

from byok.devtools import workspace_files
from byok.devtools.exec_client import PendingExec, Reply, exec_result, stream_close, throw
from byok.devtools.sim_terminals import TerminalFiles
from byok.devtools.workspace_fetch import fetch
from byok.devtools.workspace_grep import grep
from byok.devtools.workspace_shell import Shell, Shells
from byok.pb.agent import v1 as agent

if TYPE_CHECKING:
    from byok.devtools.sim_mcp import SimMcp

# exec oneof -> (result oneof, what computes the result from the root and the exec's args)
_ONE_SHOT: dict[str, tuple[str, Callable[[Path, Any], object]]] = {
    "read_args": ("read_result", workspace_files.read),
    "write_args": ("write_result", workspace_files.write),
    "delete_args": ("delete_result", workspace_files.delete),
    "grep_args": ("grep_result", grep),
    "diagnostics_args": ("diagnostics_result", workspace_files.diagnostics),
}


class WorkspaceExecutor:
    def __init__(
        self,
        root: Path,
        *,
        shell_timeout_cap_s: float = 30.0,
        mcp: SimMcp | None = None,
        terminals_folder: Path | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.mcp = mcp
        # A backgrounded shell's output goes to a terminal file there, as Cursor's does.
        terminals = None if terminals_folder is None else TerminalFiles(terminals_folder)
        self.shells = Shells(shell_timeout_cap_s, terminals)
        self._pending: dict[int, PendingExec] = {}

    @property
    def background(self) -> dict[int, Shell]:
        """Shells left running past their timeout, by shell id."""
        return self.shells.background

    async def run(self, msg: agent.ExecServerMessage, reply: Reply, *, delay: float = 0.0) -> None:
        """Perform one exec and send its answer(s) through ``reply``. ``delay`` postpones the
        work (an abort still lands), so tests can force the order in which execs complete."""
        pending = self._pending[msg.id] = PendingExec()
        try:
            if delay > 0:
                with trio.CancelScope() as pending.scope:
                    await trio.sleep(delay)
                pending.scope = None
            name, args = betterproto2.which_one_of(msg, "message")
            if name == "force_background_shell_args":
                moved = self.shells.force_background(args.tool_call_id)
                status = (
                    agent.ForceBackgroundShellStatus.ACCEPTED
                    if moved
                    else agent.ForceBackgroundShellStatus.NOT_FOUND
                )
                await reply(
                    exec_result(
                        msg, force_background_shell_result=agent.ForceBackgroundShellResult(status=status)
                    )
                )
                await reply(stream_close(msg.id))
            elif name == "shell_stream_args":
                cwd = self.resolve(args.working_directory)
                await self.shells.run(msg, args, reply, pending, cwd=cwd, root=self.root)
            elif pending.aborted:
                await reply(stream_close(msg.id))  # aborted before it ran: nothing to report
            elif self.mcp is not None and (answers := self.mcp.answer(msg)) is not None:
                for answer in answers:
                    await reply(answer)
            elif name == "fetch_args":
                with trio.CancelScope() as pending.scope:
                    result = await fetch(args)
                pending.scope = None
                if not pending.aborted:
                    await reply(exec_result(msg, fetch_result=result))
                await reply(stream_close(msg.id))
            elif name not in _ONE_SHOT:
                await reply(throw(msg.id, f"unsupported exec {name or '(none)'}"))
            else:
                field, perform = _ONE_SHOT[name]
                try:
                    result = perform(self.root, args)
                except Exception as exc:  # a bug here must not hang the run: Cursor would throw
                    await reply(throw(msg.id, f"{type(exc).__name__}: {exc}"))
                    return
                await reply(exec_result(msg, **{field: result}))
                await reply(stream_close(msg.id))
        finally:
            if self._pending.get(msg.id) is pending:
                del self._pending[msg.id]

    def abort(self, exec_id: int) -> None:
        """ExecServerAbort: stop the exec with this id if it is still running."""
        if (pending := self._pending.get(exec_id)) is not None:
            pending.abort()

    async def aclose(self) -> None:
        """Kill every process still running (backgrounded shells included) and reap them."""
        for pending in list(self._pending.values()):
            pending.abort()
        await self.shells.aclose()

    def resolve(self, path: str) -> Path | None:
        """The real path inside root, or None when it (or a symlink on the way) leaves root."""
        return workspace_files.resolve_in(self.root, path)
