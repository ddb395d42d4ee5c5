"""How a command on this machine reaches the daemon of a config: the address it listens on
(the data dir's lock file says, else the config), with LAN mode's TLS and credential."""

from __future__ import annotations

from urllib.parse import urlsplit

import attrs

from byok.config import Config, ConfigError
from byok.cursor_setup import local_url
from byok.daemon_lock import read_holder
from byok.http.ca import CA_CERT, CA_DIR
from byok.http.serve import is_loopback


@attrs.frozen
class DaemonAddress:
    base: str  # where requests go: the credential's path segment included (LAN mode)
    shown: str  # the same without the credential, for messages
    # False for a loopback address: the same machine, whichever name the certificate has.
    verify: bool | str


class NoDaemon(Exception):
    """No address to reach: the config's port is picked at start (0) and no daemon runs on its
    data dir yet, or the one that does has not bound its port yet."""


def daemon_address(config: Config, url: str | None = None) -> DaemonAddress:
    """``url`` (``--url``), else the running daemon's (its lock file), else the config's."""
    if url is None:
        holder = read_holder(config.server.data_dir)
        port = urlsplit(holder.url).port if holder is not None and holder.url else None
        if port is None and holder is not None and holder.url is None:
            raise NoDaemon(f"byok (pid {holder.pid}) on data dir {config.server.data_dir} is still starting")
        if port is None and config.server.port == 0:
            raise NoDaemon(
                f"no byok is running on data dir {config.server.data_dir} ({config.source} has it pick "
                "a port at start): start one with byok serve, or give --url"
            )
        url = local_url(config.server.host, port or config.server.port)
        if config.server.tls:
            url = "https" + url.removeprefix("http")
    shown = url.rstrip("/")
    base = shown
    if config.server.has_auth_token:
        try:
            token = config.server.auth_token()
        except ConfigError:
            token = None  # the daemon answers 401, which says what is missing
        if token:
            base = f"{shown}/{token}"
    verify: bool | str = True
    host = urlsplit(shown).hostname or ""
    if shown.startswith("https:") and is_loopback(host):
        verify = False
    elif shown.startswith("https:") and config.server.tls_names and config.server.tls_cert is None:
        verify = str(config.server.data_dir / CA_DIR / CA_CERT)  # issued by byok's CA
    return DaemonAddress(base, shown, verify)
