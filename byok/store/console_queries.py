"""What the console reads: provider calls (list, filter, one), conversations with their turns
and revisions, usage per day x model x provider. Plain JSON-ready dicts; the bodies only on
request. Functions take a connection inside the caller's read transaction.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import attrs

from byok.store import call_bodies
from byok.store.records import LlmCallRecord

# The list's columns: never the bodies (a request may be megabytes).
_CALL_COLUMNS = (
    "id",
    "started_at_ms",
    "request_id",
    "conversation_id",
    "provider_id",
    "model",
    "model_id",
    "alias_id",
    "status",
    "error",
    "error_kind",
    "http_status",
    "queue_ms",
    "ttfb_ms",
    "ttft_ms",
    "duration_ms",
    "attempts",
    "event_count",
    "byte_count",
    "prefix_extends",
    "common_prefix_messages",
    "cache_hit_share",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
MAX_LIMIT = 500


@attrs.frozen
class CallFilter:
    since_ms: int | None = None
    until_ms: int | None = None
    model: str | None = None  # the byok model id, or the upstream model name
    provider: str | None = None
    status: str | None = None
    conversation: str | None = None
    before_id: int | None = None  # paging: calls older than this one
    limit: int = 100


def call_json(fields: dict[str, Any]) -> dict[str, Any]:
    """A call as the API shows it: usage grouped, retries counted, the rest as stored."""
    out = {k: v for k, v in fields.items() if k not in _USAGE_KEYS}
    if out.get("prefix_extends") is not None:
        out["prefix_extends"] = bool(out["prefix_extends"])
    attempts = out.get("attempts")
    out["retries"] = None if attempts is None else max(0, attempts - 1)
    reported = fields.get("input_tokens") is not None
    out["usage"] = {k.removesuffix("_tokens"): fields.get(k) for k in _USAGE_KEYS} if reported else None
    return out


def record_json(rec: LlmCallRecord) -> dict[str, Any]:
    """A just-written record in the list's shape (for the live stream)."""
    usage = rec.usage
    fields: dict[str, Any] = {c: getattr(rec, c, None) for c in _CALL_COLUMNS if c not in _USAGE_KEYS}
    for key in _USAGE_KEYS:
        fields[key] = None if usage is None else getattr(usage, key)
    return call_json(fields)


def list_calls(conn: sqlite3.Connection, f: CallFilter) -> list[dict[str, Any]]:
    where, args = [], []
    for clause, value in (
        ("started_at_ms >= ?", f.since_ms),
        ("started_at_ms < ?", f.until_ms),
        ("provider_id = ?", f.provider),
        ("status = ?", f.status),
        ("conversation_id = ?", f.conversation),
        ("id < ?", f.before_id),
    ):
        if value is not None:
            where.append(clause)
            args.append(value)
    if f.model is not None:
        where.append("(model_id = ? OR model = ? OR alias_id = ?)")
        args += [f.model] * 3
    sql = f"SELECT {', '.join(_CALL_COLUMNS)} FROM llm_calls"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC LIMIT ?"
    rows = conn.execute(sql, (*args, min(f.limit, MAX_LIMIT))).fetchall()
    return [call_json(dict(zip(_CALL_COLUMNS, row, strict=True))) for row in rows]


def call_detail(conn: sqlite3.Connection, call_id: int) -> dict[str, Any] | None:
    row = conn.execute(
        f"SELECT {', '.join(_CALL_COLUMNS)}, request_body IS NOT NULL OR body_base_id IS NOT NULL,"
        " response_capture IS NOT NULL, request_sha256, messages_sha256 FROM llm_calls WHERE id = ?",
        (call_id,),
    ).fetchone()
    if row is None:
        return None
    n = len(_CALL_COLUMNS)
    out = call_json(dict(zip(_CALL_COLUMNS, row[:n], strict=True)))
    out["has_request_body"], out["has_response_body"] = bool(row[n]), bool(row[n + 1])
    out["request_sha256"], out["messages_sha256"] = row[n + 2], row[n + 3]
    return out


def call_body(conn: sqlite3.Connection, call_id: int, part: str) -> bytes | None:
    """The stored request body (rebuilt whole) or response capture of one call."""
    if part == "response":
        row = conn.execute("SELECT response_capture FROM llm_calls WHERE id = ?", (call_id,)).fetchone()
        return None if row is None else row[0]
    row = conn.execute(
        "SELECT request_body, body_base_id, body_shared_bytes FROM llm_calls WHERE id = ?", (call_id,)
    ).fetchone()
    if row is None:
        return None
    return call_bodies.full_body(conn, row[0], row[1], row[2])


_SUMS = (
    "COUNT(*), SUM(status = 'error'), SUM(input_tokens), SUM(output_tokens), SUM(cache_read_tokens),"
    " SUM(cache_write_tokens), SUM(reasoning_tokens)"
)


def _sums(values: tuple[Any, ...]) -> dict[str, Any]:
    calls, errors, inp, out, read, write, reasoning = values
    share = None if not inp or read is None else read / inp
    return {
        "calls": calls,
        "errors": errors or 0,
        "usage": {
            "input": inp or 0,
            "output": out or 0,
            "cache_read": read or 0,
            "cache_write": write or 0,
            "reasoning": reasoning or 0,
        },
        "cache_hit_share": share,
    }


def usage(
    conn: sqlite3.Connection, since_ms: int | None, until_ms: int | None, tz_offset_min: int
) -> list[dict[str, Any]]:
    """Per day (shifted by ``tz_offset_min``, minutes east of UTC) x model x provider."""
    offset_ms = tz_offset_min * 60_000
    rows = conn.execute(
        "SELECT date((started_at_ms + ?) / 1000, 'unixepoch') AS day, COALESCE(model_id, model),"
        f" provider_id, {_SUMS} FROM llm_calls WHERE started_at_ms >= ? AND started_at_ms < ?"
        " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        (offset_ms, since_ms if since_ms is not None else 0, until_ms if until_ms is not None else 2**62),
    ).fetchall()
    return [{"day": r[0], "model": r[1], "provider": r[2], **_sums(r[3:])} for r in rows]


def conversations(conn: sqlite3.Connection, limit: int, before_ms: int | None) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT c.conversation_id, c.created_at_ms, c.updated_at_ms,"
        " (SELECT COUNT(*) FROM runs r WHERE r.conversation_id = c.conversation_id),"
        " (SELECT COUNT(*) FROM revisions v WHERE v.conversation_id = c.conversation_id),"
        " (SELECT model_id FROM runs r WHERE r.conversation_id = c.conversation_id"
        "  ORDER BY started_at_ms DESC LIMIT 1)"
        " FROM conversations c WHERE c.updated_at_ms < ? ORDER BY c.updated_at_ms DESC LIMIT ?",
        (before_ms if before_ms is not None else 2**62, min(limit, MAX_LIMIT)),
    ).fetchall()
    out = []
    for cid, created, updated, turns, revisions, model in rows:
        sums = conn.execute(f"SELECT {_SUMS} FROM llm_calls WHERE conversation_id = ?", (cid,)).fetchone()
        out.append(
            {
                "conversation_id": cid,
                "created_at_ms": created,
                "updated_at_ms": updated,
                "turns": turns,
                "revisions": revisions,
                "last_model": model,
                **_sums(sums),
            }
        )
    return out


def conversation(conn: sqlite3.Connection, conversation_id: str) -> dict[str, Any] | None:
    head = conn.execute(
        "SELECT created_at_ms, updated_at_ms, head_revision FROM conversations WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()
    runs = conn.execute(
        "SELECT request_id, model_id, status, error_code, error_message, started_at_ms, ended_at_ms,"
        " input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens"
        " FROM runs WHERE conversation_id = ? ORDER BY started_at_ms, request_id",
        (conversation_id,),
    ).fetchall()
    if head is None and not runs:
        return None
    per_run = dict(
        conn.execute(
            "SELECT request_id, COUNT(*) FROM llm_calls WHERE conversation_id = ? GROUP BY request_id",
            (conversation_id,),
        ).fetchall()
    )
    turns = []
    for r in runs:
        inp, read = r[7], r[9]
        turns.append(
            {
                "request_id": r[0],
                "model_id": r[1],
                "status": r[2],
                "error": None if r[3] is None else f"{r[3]}: {r[4]}",
                "started_at_ms": r[5],
                "ended_at_ms": r[6],
                "calls": per_run.get(r[0], 0),
                "usage": None
                if inp is None
                else dict(
                    zip(("input", "output", "cache_read", "cache_write", "reasoning"), r[7:12], strict=True)
                ),
                "cache_hit_share": None if not inp or read is None else read / inp,
            }
        )
    revisions = [
        {"id": v[0], "parent_id": v[1], "message_count": v[2], "created_at_ms": v[3]}
        for v in conn.execute(
            "SELECT id, parent_id, message_count, created_at_ms FROM revisions"
            " WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
    ]
    sums = conn.execute(
        f"SELECT {_SUMS} FROM llm_calls WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return {
        "conversation_id": conversation_id,
        "created_at_ms": head[0] if head else None,
        "updated_at_ms": head[1] if head else None,
        "head_revision": head[2] if head else None,
        "turns": turns,
        "revisions": revisions,
        **_sums(sums),
    }
