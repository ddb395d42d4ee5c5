"""The simulated client's terminal files: what Cursor writes for a shell it moved to the background.

``<folder>/<shell_id>.txt`` gets a header block (pid, cwd, command, when it started), then
everything the command printed so far and, as it keeps printing, the rest; when the command
exits, a footer block with its exit code, how long it ran and when it ended. The format is
the one byok's AwaitShell reads (cursor/tools/terminal_file.py).
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from byok.devtools.workspace_shell import Shell


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


class TerminalFiles:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, shell_id: int) -> Path:
        return self.folder / f"{shell_id}.txt"

    def background(self, shell_id: int, shell: Shell) -> None:
        """Start the file of a shell just backgrounded: its output so far, then as it comes."""
        path = self.path(shell_id)
        started = time.time()
        header = (
            f"---\npid: {shell.process.pid}\ncwd: {shell.cwd}\ncommand: {shell.command}\n"
            f"started_at: {_iso(started)}\n---\n"
        )
        path.write_text(header + "".join(shell.printed), encoding="utf-8")

        def append(text: str) -> None:
            with path.open("a", encoding="utf-8") as f:
                f.write(text)

        shell.on_output = append
        trio.lowlevel.spawn_system_task(self._footer, path, shell, started)

    async def _footer(self, path: Path, shell: Shell, started: float) -> None:
        # A system task: a backgrounded command outlives the exec and the run that started it.
        code = await shell.process.wait()
        await shell.drained.wait()  # every byte it printed is in the file before the footer
        ended = time.time()
        exit_code = 128 - code if code < 0 else code
        with path.open("a", encoding="utf-8") as f:
            f.write(
                f"\n---\nexit_code: {exit_code}\nelapsed_ms: {int((ended - started) * 1000)}\n"
                f"ended_at: {_iso(ended)}\n---\n"
            )
