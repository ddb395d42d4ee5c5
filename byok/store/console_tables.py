"""The entries made in the console (providers, models, aliases) and which alias and model a
provider call served.

An entry is a row per (kind, id): its public fields as JSON (``data``) and, for a provider, its
secrets (key and headers) sealed by ``byok.console.secret_box`` (``sealed``; never clear text).
The console reads them all at once (they are few) and merges them with the config file's
(``byok.console.catalog``). Functions take a connection inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3

import attrs

ENTRY_KINDS = ("provider", "model", "alias")

# Version 9.
V9: tuple[str, ...] = (
    """CREATE TABLE console_entries (
    kind TEXT NOT NULL CHECK (kind IN ('provider', 'model', 'alias')),
    id TEXT NOT NULL,
    data TEXT NOT NULL,
    sealed BLOB,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
) WITHOUT ROWID""",
    # The byok model that served a call and, when Cursor picked an alias, which one.
    "ALTER TABLE llm_calls ADD COLUMN model_id TEXT",
    "ALTER TABLE llm_calls ADD COLUMN alias_id TEXT",
    # The console lists and sums calls by time.
    "CREATE INDEX llm_calls_by_time ON llm_calls(started_at_ms)",
)


@attrs.frozen
class EntryRow:
    kind: str
    id: str
    data: str
    sealed: bytes | None = attrs.field(repr=False)
    created_at_ms: int
    updated_at_ms: int


def entries(conn: sqlite3.Connection) -> list[EntryRow]:
    rows = conn.execute(
        "SELECT kind, id, data, sealed, created_at_ms, updated_at_ms FROM console_entries ORDER BY kind, id"
    ).fetchall()
    return [EntryRow(*row) for row in rows]


def put_entry(
    conn: sqlite3.Connection, kind: str, entry_id: str, data: str, sealed: bytes | None, now_ms: int
) -> None:
    """Insert or replace the entry, keeping its creation time."""
    conn.execute(
        "INSERT INTO console_entries (kind, id, data, sealed, created_at_ms, updated_at_ms)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (kind, id) DO UPDATE SET"
        " data = excluded.data, sealed = excluded.sealed, updated_at_ms = excluded.updated_at_ms",
        (kind, entry_id, data, sealed, now_ms, now_ms),
    )


def delete_entry(conn: sqlite3.Connection, kind: str, entry_id: str) -> bool:
    cur = conn.execute("DELETE FROM console_entries WHERE kind = ? AND id = ?", (kind, entry_id))
    return cur.rowcount == 1
