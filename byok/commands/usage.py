"""`byok calls` (the recent provider calls) and `byok stats` (usage per day and model)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import sys
import time
from collections.abc import Sequence

import attrs

from byok.commands.config_args import load_from_args
from byok.config import ConfigError
from byok.store import StoreError
from byok.store.usage_report import CallRow, DayUsage, open_read_only, recent_calls, usage_by_day

DAY_MS = 86_400_000


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f}s"


def _local(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _status(call: CallRow) -> str:
    if call.status != "error":
        return call.status
    return f"error {call.http_status}" if call.http_status else "error"


def calls_text(calls: Sequence[CallRow]) -> str:
    if not calls:
        return "no provider calls recorded yet"
    header = ("time", "model", "status", "tokens in", "out", "cache hit", "TTFT", "duration", "request")
    rows = [
        (
            _local(c.started_at_ms),
            c.model,
            _status(c),
            _n(c.input_tokens),
            _n(c.output_tokens),
            _share(c.cache_hit_share),
            _seconds(c.ttft_ms),
            _seconds(c.duration_ms),
            c.request_id,
        )
        for c in reversed(calls)  # oldest first, the newest last (next to the prompt)
    ]
    lines = _table(header, rows, frozenset({3, 4, 5, 6, 7}))
    errors = [c for c in reversed(calls) if c.error]
    lines += [f"{_local(c.started_at_ms)} {c.request_id}: {c.error}" for c in errors]
    return "\n".join(lines)


def stats_text(days: Sequence[DayUsage], since: str) -> str:
    if not days:
        return f"no provider calls since {since}"
    header = ("day", "model", "calls", "errors", "tokens in", "cached", "out")
    rows = [
        (
            d.day,
            d.model,
            _n(d.calls),
            _n(d.errors),
            _n(d.input_tokens),
            _share(d.cached_share),
            _n(d.output_tokens),
        )
        for d in days
    ]
    total_in, total_read = sum(d.input_tokens for d in days), sum(d.cache_read_tokens for d in days)
    rows.append(
        (
            "total",
            "",
            _n(sum(d.calls for d in days)),
            _n(sum(d.errors for d in days)),
            _n(total_in),
            _share(total_read / total_in if total_in else None),
            _n(sum(d.output_tokens for d in days)),
        )
    )
    return "\n".join(_table(header, rows, frozenset({2, 3, 4, 5, 6})))


def _open(args: argparse.Namespace) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(open_read_only(load_from_args(args).server.data_dir))


def cmd_calls(args: argparse.Namespace) -> int:
    try:
        with _open(args) as conn:
            calls = recent_calls(conn, args.limit, args.model)
    except (ConfigError, StoreError) as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    if args.json:
        print(json.dumps([attrs.asdict(c) for c in calls], indent=2))
    else:
        print(calls_text(calls))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    since_ms = int(time.time() * 1000) - (args.days - 1) * DAY_MS
    # From the start of that local day.
    since = time.strftime("%Y-%m-%d", time.localtime(since_ms / 1000))
    since_ms = int(time.mktime(time.strptime(since, "%Y-%m-%d")) * 1000)
    try:
        with _open(args) as conn:
            days = usage_by_day(conn, since_ms)
    except (ConfigError, StoreError) as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    if args.json:
        print(json.dumps([{**attrs.asdict(d), "cached_share": d.cached_share} for d in days], indent=2))
    else:
        print(stats_text(days, since))
    return 0
