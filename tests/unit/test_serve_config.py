"""hypercorn settings the daemon depends on."""

from __future__ import annotations

import httpx

from byok.http.serve import server_config


def test_server_outwaits_the_clients_idle_connections() -> None:
    # A client reuses a pooled connection until its own idle expiry; if the server closed idle
    # connections at the same moment, an append sent on one could be lost mid-close.
    config = server_config("127.0.0.1", 0)
    assert config.keep_alive_timeout >= 60 * httpx.Limits().keepalive_expiry  # httpx: 5 s
    assert config.read_timeout is None  # agent streams sit quiet for minutes
