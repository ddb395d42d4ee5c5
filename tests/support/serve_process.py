"""`byok serve` and the other commands as real subprocesses, in a home of the test's own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

ROOT = Path(__file__).resolve().parents[2]


def command_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a byok command run by a user whose home is ``home``: none of this
    machine's byok settings (BYOK_*, a config or keys file in the real home) leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BYOK_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), **extra)
    return env


def byok_cmd(*args: str, home: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "byok", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=command_env(home, **env),
        timeout=timeout,
    )


@attrs.define
class Served:
    proc: trio.Process
    url: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for_log(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        """The first match of ``pattern`` in the daemon's log, once it is written."""
        with trio.fail_after(timeout):
            while True:
                found = re.search(pattern, self.text())
                if found:
                    return found
                assert self.proc.returncode is None, f"byok serve exited: {self.text()}"
                await trio.sleep(0.05)

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        with trio.fail_after(20):
            return await self.proc.wait()


@asynccontextmanager
async def serve_process(*args: str, home: Path, log: Path, **env: str) -> AsyncIterator[Served]:
    """`byok serve ARGS` until its start-up summary says where it listens; killed if the test
    leaves it running."""
    with log.open("ab") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "byok", "serve", *args],
            cwd=ROOT,
            env=command_env(home, **env),
            stdout=out,
            stderr=out,
        )
    served = Served(proc, "", log)
    try:
        served.url = (await served.wait_for_log(r"byok listening on (https?://\S+)")).group(1)
        yield served
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.move_on_after(5):
                await proc.wait()
