"""What `byok calls` and `byok stats` read from the call log (``llm_calls``), read-only: the
daemon may be writing meanwhile (WAL lets both)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs

from byok.store.errors import StoreError
from byok.store.schema import SCHEMA_VERSION
from byok.store.sqlite_store import DB_FILENAME


def open_read_only(data_dir: Path) -> sqlite3.Connection:
    path = data_dir / DB_FILENAME
    if not path.exists():
        raise StoreError(f"no database at {path}: byok has not run with this data dir")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.execute("PRAGMA busy_timeout=5000")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as e:
        raise StoreError(f"cannot read {path}: {e}") from e
    if not 2 <= version <= SCHEMA_VERSION:  # version 2 added the call records' columns
        conn.close()
        raise StoreError(f"{path} has schema version {version}; this byok reads 2 to {SCHEMA_VERSION}")
    return conn


@attrs.frozen
class CallRow:
    started_at_ms: int
    request_id: str
    conversation_id: str
    model: str  # byok's model id (the run's), else the upstream name
    upstream_model: str
    provider: str
    status: str  # ok | error | canceled
    http_status: int | None
    error: str | None
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_hit_share: float | None
    ttft_ms: int | None
    duration_ms: int | None


def recent_calls(conn: sqlite3.Connection, limit: int, model: str | None = None) -> list[CallRow]:
    """The newest ``limit`` calls (of ``model``, byok's id or the upstream name), newest first."""
    where, params = (
        ("", [])
        if model is None
        else ("WHERE coalesce(r.model_id, c.model) = ? OR c.model = ?", [model, model])
    )
    rows = conn.execute(
        f"""SELECT c.started_at_ms, c.request_id, c.conversation_id, coalesce(r.model_id, c.model), c.model,
                   c.provider_id, c.status, c.http_status, c.error, c.input_tokens, c.output_tokens,
                   c.cache_read_tokens, c.cache_hit_share, c.ttft_ms, c.duration_ms
            FROM llm_calls c LEFT JOIN runs r ON r.request_id = c.request_id
            {where} ORDER BY c.id DESC LIMIT ?""",
        [*params, limit],
    ).fetchall()
    return [CallRow(*row) for row in rows]


@attrs.frozen
class DayUsage:
    day: str  # YYYY-MM-DD, local time
    model: str
    calls: int
    errors: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int

    @property
    def cached_share(self) -> float | None:
        return self.cache_read_tokens / self.input_tokens if self.input_tokens else None


def usage_by_day(conn: sqlite3.Connection, since_ms: int) -> list[DayUsage]:
    """Calls and the tokens providers reported, per local day and model, oldest day first."""
    rows = conn.execute(
        """SELECT date(c.started_at_ms / 1000, 'unixepoch', 'localtime') AS day,
                  coalesce(r.model_id, c.model) AS m, count(*), sum(c.status = 'error'),
                  total(c.input_tokens), total(c.output_tokens), total(c.cache_read_tokens),
                  total(c.cache_write_tokens), total(c.reasoning_tokens)
           FROM llm_calls c LEFT JOIN runs r ON r.request_id = c.request_id
           WHERE c.started_at_ms >= ?
           GROUP BY day, m ORDER BY day, m""",
        [since_ms],
    ).fetchall()
    return [DayUsage(day, m, n, int(err), *(int(v) for v in sums)) for day, m, n, err, *sums in rows]
