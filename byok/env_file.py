"""The keys file a service reads (``KEY=value`` lines): at start and at every SIGHUP.

A service does not see the shell's environment, so the variables ``api_key_env`` names live in
this file (``~/.config/byok/env`` by default). Its values win over the process's environment,
and a variable the file set before and no longer holds is removed again, so a key rotated or
revoked in the file takes effect at the next reload.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from pathlib import Path

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvFileError(Exception):
    """One line: the file (and line) and what is wrong."""


def parse_env(text: str, source: str) -> dict[str, str]:
    """systemd's EnvironmentFile syntax, the common part: ``NAME=value``, an optional ``export``,
    quotes around the whole value, ``#`` comments and blank lines."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not _NAME.fullmatch(name):
            raise EnvFileError(f"{source}: line {number}: expected NAME=value")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name] = value
    return values


def read_env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise EnvFileError(f"{path}: cannot read: {reason}") from None
    return parse_env(text, str(path))


class EnvFile:
    """Applies one file's variables to an environment, and later versions of it."""

    def __init__(self, path: Path, environ: MutableMapping[str, str] | None = None) -> None:
        self.path = path
        self.environ = os.environ if environ is None else environ
        self._applied: set[str] = set()

    def read(self) -> dict[str, str]:
        return read_env_file(self.path)

    def apply(self, values: dict[str, str] | None = None) -> list[str]:
        """Set the file's variables (``values``, as ``read`` gave them, else read now); returns the
        names that changed (values are never returned: they are keys). A file that cannot be
        read changes nothing."""
        if values is None:
            values = self.read()
        changed = []
        for name in sorted(self._applied - values.keys()):
            if self.environ.pop(name, None) is not None:
                changed.append(name)
        for name, value in values.items():
            if self.environ.get(name) != value:
                self.environ[name] = value
                changed.append(name)
        self._applied = set(values)
        return sorted(changed)
