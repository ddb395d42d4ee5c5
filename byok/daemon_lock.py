"""One daemon per data dir: an exclusive lock on ``<data_dir>/daemon.lock``, which also says
who holds it (pid, address, config) for a second daemon's refusal and for `byok status`.

Two daemons on one database would each take the other's commits for a conflict (every run of
a conversation both touch ends ``aborted``). The OS drops the lock with its process, so a
daemon killed with -9 never leaves a stale one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

import attrs

LOCK_FILENAME = "daemon.lock"


@attrs.frozen
class Holder:
    pid: int
    url: str | None  # None until it listens
    config: str


class DataDirInUse(Exception):
    def __init__(self, data_dir: Path, holder: Holder | None) -> None:
        self.holder = holder
        if holder is None:
            who = "another byok"
        else:
            where = f"listening on {holder.url}" if holder.url else "still starting"
            who = f"another byok (pid {holder.pid}, {where})"
        super().__init__(
            f"data dir {data_dir} is in use by {who}: stop it first (`byok status` shows it), "
            "or give this one another data_dir"
        )


def read_holder(data_dir: Path) -> Holder | None:
    """Who the lock file says holds the data dir; None when there is no readable record."""
    try:
        data = json.loads((data_dir / LOCK_FILENAME).read_text(encoding="utf-8"))
        return Holder(int(data["pid"]), data.get("url"), str(data.get("config", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class DataDirLock:
    """Held from before the store opens until after it closes."""

    def __init__(self, data_dir: Path, fd: int, config: str) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd
        self._config = config

    @classmethod
    def acquire(cls, data_dir: Path, config: str) -> DataDirLock:
        """Raises DataDirInUse, or OSError when the data dir cannot be made or the file opened."""
        if not data_dir.exists():
            data_dir.mkdir(mode=0o700, parents=True)
            data_dir.chmod(0o700)  # mkdir's mode is filtered by the umask
        fd = os.open(data_dir / LOCK_FILENAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUse(data_dir, read_holder(data_dir)) from None
        except BaseException:
            os.close(fd)
            raise
        lock = cls(data_dir, fd, config)
        lock.announce(None)
        return lock

    def announce(self, url: str | None) -> None:
        """Record this process (and, once it listens, its address) in the lock file."""
        assert self._fd is not None
        data = json.dumps({"pid": os.getpid(), "url": url, "config": self._config}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no stale record for `byok status` to read
        os.close(fd)  # closing drops the lock
