"""``GET /byok/status``: what `byok status` shows — the daemon, its config, its active runs.

It names paths and conversation ids, so only a client on this machine gets it."""

from __future__ import annotations

import os
from typing import Any

from byok.config import Config
from byok.http.asgi import Scope, Send, header, respond_json
from byok.http.offline import UpstreamHealth
from byok.http.serve import is_loopback
from byok.run.service import RunService
from byok.version import byok_version

STATUS = "/byok/status"


def from_this_machine(scope: Scope) -> bool:
    """A loopback client that asked for a loopback name: a web page whose own host name was made
    to resolve to 127.0.0.1 (DNS rebinding) still sends that name."""
    client = scope.get("client")
    host = header(scope, "host") or ""
    name = host.rsplit("]", 1)[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
    return bool(client) and is_loopback(str(client[0])) and is_loopback(name)


def status_body(
    config: Config, service: RunService, *, started_ms: int, now_ms: int, upstream_reachable: bool | None
) -> dict[str, Any]:
    runs = sorted(service.active, key=lambda r: r.started_ms)
    return {
        "status": "ok",
        "version": byok_version(),
        "pid": os.getpid(),
        "started_at_ms": started_ms,
        "config": config.source,
        "data_dir": str(config.server.data_dir),
        "providers": [p.id for p in service.deps.catalog.providers],
        "models": [m.id for m in service.deps.catalog.enabled_models()],
        "upstream": {"url": config.server.upstream, "reachable": upstream_reachable},
        "accepting_runs": service.accepting,
        "active_runs": [
            {
                "request_id": r.request_id,
                "conversation_id": r.conversation_id,
                "model": r.model_id,
                "running_ms": max(now_ms - r.started_ms, 0),
            }
            for r in runs
        ],
    }


async def respond_status(
    scope: Scope,
    send: Send,
    config: Config,
    service: RunService,
    health: UpstreamHealth | None,
    started_ms: int,
) -> None:
    # Behind LAN mode's credential (the request carried it) anyone may ask; otherwise this machine.
    if not (config.server.has_auth_token or from_this_machine(scope)):
        await respond_json(send, 403, {"error": "byok's status is for clients on this machine only"})
        return
    reachable = None if health is None else await health.reachable()
    body = status_body(
        config, service, started_ms=started_ms, now_ms=service.deps.wall_ms(), upstream_reachable=reachable
    )
    await respond_json(send, 200, body)
