"""`byok doctor`'s checks of this machine: the files byok keeps secrets in, its data dir, its
ports. Each gives one ``Check``: what was checked, what was found, and when it failed the fix."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import attrs
import httpx

from byok.commands.daemon_address import NoDaemon, daemon_address
from byok.config import Config
from byok.daemon_lock import read_holder
from byok.http.ca import CA_DIR, CA_KEY
from byok.store import DB_FILENAME


@attrs.frozen
class Check:
    ok: bool
    what: str
    found: str
    fix: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok    {self.what}: {self.found}"
        return f"FAIL  {self.what}: {self.found}; fix: {self.fix}"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def private_file(what: str, path: Path, *, missing_ok: bool = True) -> Check | None:
    """A file holding a secret is readable by its owner alone."""
    if not path.exists():
        return None if missing_ok else Check(False, what, f"{path} does not exist", "create it (mode 600)")
    mode = _mode(path)
    if mode & 0o077:
        return Check(False, what, f"{path} is readable by others (mode {mode:o})", f"chmod 600 {path}")
    return Check(True, what, f"{path} (mode {mode:o})")


def config_file(config: Config) -> list[Check]:
    holders = [p.id for p in config.providers if p.secrets_in_file]
    if config.server.auth_token_in_file:
        holders.append("[server] auth_token")
    if not holders or not Path(config.source).is_file():
        return []
    check = private_file(f"config (holds the keys of {', '.join(holders)})", Path(config.source))
    return [] if check is None else [check]


def data_dir(config: Config) -> list[Check]:
    path = config.server.data_dir
    if not path.exists():
        return [Check(True, "data dir", f"{path} does not exist yet: byok serve creates it (mode 700)")]
    if not path.is_dir():
        return [
            Check(False, "data dir", f"{path} is not a directory", "move it away, or set [server] data_dir")
        ]
    if not os.access(path, os.W_OK | os.X_OK):
        return [
            Check(False, "data dir", f"{path} is not writable by this user", f"chown it to {os.getuid()}")
        ]
    mode = _mode(path)
    if mode & 0o077:
        found = f"{path} can be listed by others (mode {mode:o}): it holds your conversations"
        return [Check(False, "data dir", found, f"chmod 700 {path}")]
    checks = [Check(True, "data dir", f"{path} (mode {mode:o})")]
    for what, file in (("database", path / DB_FILENAME), ("proxy CA key", path / CA_DIR / CA_KEY)):
        check = private_file(what, file)
        if check is not None and not check.ok:
            checks.append(check)
    return checks


def tls_key(config: Config) -> list[Check]:
    key = config.server.tls_key
    if key is None:
        return []
    check = private_file("[server] tls_key", key, missing_ok=False)
    return [] if check is None else [check]


def _held_by_byok(config: Config) -> str | None:
    """Who answers byok's health check on the configured port, when it is a byok."""
    try:
        address = daemon_address(config)
        resp = httpx.get(address.base + "/byok/healthz", timeout=5, verify=address.verify, trust_env=False)
        if resp.status_code == 200 and resp.json().get("status") == "ok":
            holder = read_holder(config.server.data_dir)
            return f"byok (pid {holder.pid})" if holder is not None else "byok"
    except (httpx.HTTPError, ValueError, NoDaemon):
        pass
    return None


def port(config: Config, host: str, number: int, what: str) -> Check:
    label = f"{what} {host}:{number}"
    if number == 0:
        return Check(True, label, "any free port is picked at start")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host.strip("[]"), number))
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return Check(
                False, label, f"cannot listen there: {e.strerror}", "pick another [server] host or port"
            )
        holder = _held_by_byok(config) if what == "port" else None
        if holder is not None:
            return Check(True, label, f"held by {holder} on this config")
        return Check(
            False, label, "taken by another program", f"stop it, or set another port in {config.source}"
        )
    return Check(True, label, "free")
