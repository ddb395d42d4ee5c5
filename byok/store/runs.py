"""Run and provider-call records: the observability half of the store.

Functions take a connection already inside the right transaction; SQLiteStore owns transactions.
"""

from __future__ import annotations

import sqlite3
from typing import Any, cast

from byok.model.usage import Usage
from byok.store import call_bodies
from byok.store.errors import RunExists, StoreError
from byok.store.records import (
    TERMINAL_RUN_STATUSES,
    BodyBase,
    ComparedPrefix,
    LlmCallRecord,
    LlmCallStatus,
    RunRecord,
    RunStatus,
)
from byok.store.schema import USAGE_COLUMNS

_USAGE_SELECT = ", ".join(USAGE_COLUMNS)


def usage_values(usage: Usage | None) -> tuple[int | None, ...]:
    if usage is None:
        return (None,) * len(USAGE_COLUMNS)
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.reasoning_tokens,
    )


def usage_from_row(values: tuple[Any, ...]) -> Usage | None:
    # Usage has mandatory input/output counts, so a NULL input count means none was reported.
    if values[0] is None:
        return None
    return Usage(*values)


def start_run(
    conn: sqlite3.Connection, request_id: str, conversation_id: str, model_id: str, now_ms: int
) -> None:
    try:
        conn.execute(
            "INSERT INTO runs (request_id, conversation_id, model_id, status, started_at_ms)"
            " VALUES (?, ?, ?, 'running', ?)",
            (request_id, conversation_id, model_id, now_ms),
        )
    except sqlite3.IntegrityError as e:
        raise RunExists(request_id) from e


def finish_run(
    conn: sqlite3.Connection,
    request_id: str,
    status: RunStatus,
    now_ms: int,
    error_code: str | None,
    error_message: str | None,
    usage: Usage | None,
) -> None:
    if status not in TERMINAL_RUN_STATUSES:
        raise ValueError(f"not a terminal run status: {status!r}")
    assignments = ", ".join(f"{c} = ?" for c in USAGE_COLUMNS)
    # The WHERE on status is what makes the terminal state write-once.
    cur = conn.execute(
        f"UPDATE runs SET status = ?, ended_at_ms = ?, error_code = ?, error_message = ?, {assignments}"
        " WHERE request_id = ? AND status = 'running'",
        (status, now_ms, error_code, error_message, *usage_values(usage), request_id),
    )
    if cur.rowcount == 1:
        return
    row = conn.execute("SELECT status FROM runs WHERE request_id = ?", (request_id,)).fetchone()
    if row is None:
        raise StoreError(f"unknown run {request_id!r}")
    raise StoreError(f"run {request_id!r} already ended with status {row[0]!r}")


def run(conn: sqlite3.Connection, request_id: str) -> RunRecord | None:
    row = conn.execute(
        "SELECT request_id, conversation_id, model_id, status, started_at_ms, ended_at_ms,"
        f" error_code, error_message, {_USAGE_SELECT} FROM runs WHERE request_id = ?",
        (request_id,),
    ).fetchone()
    if row is None:
        return None
    return RunRecord(
        request_id=row[0],
        conversation_id=row[1],
        model_id=row[2],
        status=cast(RunStatus, row[3]),
        started_at_ms=row[4],
        ended_at_ms=row[5],
        error_code=row[6],
        error_message=row[7],
        usage=usage_from_row(row[8:]),
    )


# Column order shared by the INSERT and the SELECTs below.
_LLM_COLUMNS = (
    "request_id",
    "conversation_id",
    "provider_id",
    "model",
    "request_body",
    "request_sha256",
    "messages_sha256",
    "status",
    "started_at_ms",
    "duration_ms",
    "error",
    "http_status",
    "ttfb_ms",
    "ttft_ms",
    "event_count",
    "byte_count",
    # Schema version 2.
    "queue_ms",
    "attempts",
    "error_kind",
    "prefix_extends",
    "common_prefix_messages",
    "cache_hit_share",
    "response_capture",
    # Schema version 6 (store/call_bodies.py).
    "compared_bytes",
    "compared_messages",
    "compared_sha256",
    # Schema version 9 (store/console_tables.py).
    "model_id",
    "alias_id",
)
# Schema version 4 (store/call_bodies.py): how request_body is stored.
_BODY_COLUMNS = ("body_base_id", "body_shared_bytes", "body_depth")
_LLM_SELECT = (
    f"SELECT id, {', '.join(_LLM_COLUMNS)}, {_USAGE_SELECT}, body_base_id, body_shared_bytes FROM llm_calls"
)


def _llm_values(
    rec: LlmCallRecord, stored: tuple[bytes | None, int | None, int | None, int]
) -> tuple[Any, ...]:
    values = [getattr(rec, c) for c in _LLM_COLUMNS]
    extends = _LLM_COLUMNS.index("prefix_extends")
    if values[extends] is not None:
        values[extends] = int(values[extends])
    values[_LLM_COLUMNS.index("request_body")] = stored[0]
    return (*values, *usage_values(rec.usage), *stored[1:])


def _llm_record(conn: sqlite3.Connection, row: tuple[Any, ...]) -> LlmCallRecord:
    n = len(_LLM_COLUMNS)
    fields = dict(zip(_LLM_COLUMNS, row[1 : n + 1], strict=True))
    fields["status"] = cast(LlmCallStatus, fields["status"])
    if fields["prefix_extends"] is not None:
        fields["prefix_extends"] = bool(fields["prefix_extends"])
    base_id, shared = row[-2], row[-1]
    fields["request_body"] = call_bodies.full_body(conn, fields["request_body"], base_id, shared)
    base = None if base_id is None else BodyBase(base_id, shared)
    usage = usage_from_row(row[n + 1 : n + 1 + len(USAGE_COLUMNS)])
    return LlmCallRecord(**fields, usage=usage, id=row[0], body_base=base)


_INSERT_COLUMNS = (*_LLM_COLUMNS, *USAGE_COLUMNS, *_BODY_COLUMNS)
_LLM_INSERT = (
    f"INSERT INTO llm_calls ({', '.join(_INSERT_COLUMNS)}) VALUES ({', '.join('?' * len(_INSERT_COLUMNS))})"
)


def record_llm_call(conn: sqlite3.Connection, rec: LlmCallRecord) -> int:
    base = rec.body_base
    stored = call_bodies.stored_form(
        conn,
        rec.conversation_id,
        rec.request_body,
        None if base is None else base.record_id,
        0 if base is None else base.shared_bytes,
    )
    cur = conn.execute(_LLM_INSERT, _llm_values(rec, stored))
    assert cur.lastrowid is not None
    return cur.lastrowid


def llm_calls(conn: sqlite3.Connection, request_id: str) -> list[LlmCallRecord]:
    rows = conn.execute(f"{_LLM_SELECT} WHERE request_id = ? ORDER BY id", (request_id,)).fetchall()
    return [_llm_record(conn, row) for row in rows]


def last_llm_call_prefix(conn: sqlite3.Connection, conversation_id: str) -> ComparedPrefix | None:
    """The row id and compared prefix of the conversation's last call, without its body; None
    when it has no calls. The prefix's fields are None on rows that do not have one."""
    row = conn.execute(
        "SELECT id, compared_bytes, compared_messages, compared_sha256 FROM llm_calls"
        " WHERE conversation_id = ? ORDER BY id DESC LIMIT 1",
        (conversation_id,),
    ).fetchone()
    return None if row is None else ComparedPrefix(*row)


def last_llm_call(conn: sqlite3.Connection, conversation_id: str) -> LlmCallRecord | None:
    row = conn.execute(
        f"{_LLM_SELECT} WHERE conversation_id = ? ORDER BY id DESC LIMIT 1", (conversation_id,)
    ).fetchone()
    return None if row is None else _llm_record(conn, row)


def prefix_stats(conn: sqlite3.Connection, conversation_id: str | None) -> tuple[int, int]:
    """(calls compared with a previous call, calls whose messages extended it), for one
    conversation or (None) all of them. First calls and pre-version-2 rows are not compared."""
    sql = "SELECT COUNT(prefix_extends), COALESCE(SUM(prefix_extends), 0) FROM llm_calls"
    if conversation_id is None:
        row = conn.execute(sql).fetchone()
    else:
        row = conn.execute(f"{sql} WHERE conversation_id = ?", (conversation_id,)).fetchone()
    return int(row[0]), int(row[1])
