"""The console's token: made on the first start, shown once, kept only as its SHA-256.

The token is 32 random bytes (URL-safe base64), so a plain SHA-256 is enough to keep it: there
is nothing to guess. The hash lives in ``{data_dir}/console-token.sha256`` (0600); ``byok
console-token`` writes a new one, and a running daemon notices the file changed (its inode,
mtime and size are checked on each request) without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

TOKEN_FILENAME = "console-token.sha256"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(data_dir: Path) -> str:
    """A fresh token whose hash replaces the stored one (atomically); returns it, to show once."""
    token = secrets.token_urlsafe(32)
    path = data_dir / TOKEN_FILENAME
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (_digest(token) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def ensure_token(data_dir: Path) -> str | None:
    """The new token when the data dir had none (the first start), else None."""
    if (data_dir / TOKEN_FILENAME).exists():
        return None
    return new_token(data_dir)


class TokenCheck:
    """Compares a presented token with the stored hash, re-reading the file when it changed."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / TOKEN_FILENAME
        self._seen: tuple[int, int, int] | None = None
        self._digest = ""

    def _current(self) -> str:
        try:
            st = self._path.stat()
        except OSError:
            return ""
        # The inode too: a new token replaces the file, and two writes within the file system's
        # timestamp tick leave the same mtime and size (the test that replaced it at once failed).
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._seen:
            try:
                self._digest = self._path.read_text().strip()
            except OSError:
                return ""
            self._seen = key
        return self._digest

    def accepts(self, presented: str) -> bool:
        stored = self._current()
        # No stored hash means no token can be right (never "no token needed").
        return bool(stored) and bool(presented) and hmac.compare_digest(_digest(presented), stored)
