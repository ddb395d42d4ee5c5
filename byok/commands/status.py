"""`byok status`: is a daemon running on this config's data dir, is it healthy, what is it running."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from byok.commands.config_args import load_from_args
from byok.commands.daemon_address import daemon_address
from byok.config import ConfigError
from byok.daemon_lock import read_holder

EXIT_NOT_RUNNING = 3  # as `systemctl status` for a stopped unit
STATUS_TIMEOUT_S = 5.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _duration(ms: float) -> str:
    s = int(ms // 1000)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def status_text(body: dict[str, Any], url: str, config_source: str, now_ms: int) -> str:
    up = body.get("upstream") or {}
    reachable = {True: "reachable", False: "unreachable", None: "not checked"}[up.get("reachable")]
    lines = [
        f"byok {body['version']} is running: pid {body['pid']}, {url}, "
        f"up {_duration(now_ms - body['started_at_ms'])}",
        f"  config: {body['config']}"
        + ("" if body["config"] == config_source else f" (this command read {config_source})"),
        f"  data dir: {body['data_dir']}",
        f"  models: {', '.join(body['models']) or 'none'}",
        f"  Cursor's backend: {up.get('url')} ({reachable})",
    ]
    if not body.get("accepting_runs", True):
        lines.append("  shutting down: new runs are refused")
    runs = body["active_runs"]
    lines.append(f"  active runs: {len(runs)}")
    lines += [
        f"    {r['request_id']}: model {r['model']}, conversation {r['conversation_id']}, "
        f"running {_duration(r['running_ms'])}"
        for r in runs
    ]
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    import httpx

    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2
    data_dir: Path = config.server.data_dir
    holder = read_holder(data_dir)
    if holder is None or not _alive(holder.pid):
        print(f"byok is not running on data dir {data_dir} (config: {config.source})")
        return EXIT_NOT_RUNNING
    if holder.url is None:
        print(f"byok (pid {holder.pid}) is starting on data dir {data_dir}")
        return 1
    address = daemon_address(config)  # the holder's address: it has its port
    try:
        resp = httpx.get(
            address.base + "/byok/status", timeout=STATUS_TIMEOUT_S, trust_env=False, verify=address.verify
        )
        resp.raise_for_status()
        body = resp.json()
    except (httpx.HTTPError, ValueError) as e:
        print(
            f"byok (pid {holder.pid}) holds data dir {data_dir} but does not answer at {address.shown}: {e}"
        )
        return 1
    if args.json:
        print(json.dumps({"url": address.shown, **body}, indent=2))
    else:
        print(status_text(body, address.shown, config.source, int(time.time() * 1000)))
    return 0
