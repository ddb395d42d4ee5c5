"""Revision lineage queries: ancestors by message count, the turn list a revision published,
and start-up recovery of runs a crash left 'running'. Plain functions run inside the store's
transactions (sqlite_store.py owns the connection)."""

from __future__ import annotations

import sqlite3

# Version 3: which Cursor turn blobs the final checkpoint at a revision listed, so the next run
# (or an edit branching back to that revision) continues the right turn list.
V3: tuple[str, ...] = (
    """CREATE TABLE revision_turns (
    revision_id INTEGER PRIMARY KEY REFERENCES revisions(id),
    turns BLOB NOT NULL CHECK (length(turns) % 32 = 0)
)""",
)

_CHAIN = """WITH RECURSIVE chain(id, parent_id, message_count, depth) AS (
    SELECT id, parent_id, message_count, 0 FROM revisions WHERE id = ?
    UNION ALL
    SELECT r.id, r.parent_id, r.message_count, c.depth + 1
    FROM revisions r JOIN chain c ON r.id = c.parent_id
)"""


def ancestor_with_count(conn: sqlite3.Connection, revision_id: int | None, count: int) -> int | None:
    """The revision on ``revision_id``'s chain whose history has exactly ``count`` messages."""
    if count == 0 or revision_id is None:
        return None
    row = conn.execute(
        _CHAIN + " SELECT id FROM chain WHERE message_count = ? ORDER BY depth LIMIT 1",
        (revision_id, count),
    ).fetchone()
    if row is None:
        raise LookupError(f"no ancestor of revision {revision_id} has {count} messages")
    return int(row[0])


def turns_at(conn: sqlite3.Connection, revision_id: int | None) -> tuple[bytes, ...]:
    """The turn list recorded at the nearest revision on the chain (failed runs record none)."""
    if revision_id is None:
        return ()
    row = conn.execute(
        _CHAIN + " SELECT t.turns FROM chain c JOIN revision_turns t ON t.revision_id = c.id"
        " ORDER BY c.depth LIMIT 1",
        (revision_id,),
    ).fetchone()
    if row is None:
        return ()
    data = bytes(row[0])
    return tuple(data[i : i + 32] for i in range(0, len(data), 32))


def save_turns(conn: sqlite3.Connection, revision_id: int, turns: tuple[bytes, ...]) -> None:
    if any(len(t) != 32 for t in turns):
        raise ValueError("turn ids are 32-byte SHA-256 digests")
    conn.execute(
        "INSERT OR REPLACE INTO revision_turns (revision_id, turns) VALUES (?, ?)",
        (revision_id, b"".join(turns)),
    )


def interrupt_running_runs(conn: sqlite3.Connection, now_ms: int) -> int:
    """Runs a crash or kill left 'running' end as errors; their terminal state is written once."""
    cur = conn.execute(
        "UPDATE runs SET status = 'error', error_code = 'aborted',"
        " error_message = 'interrupted: the daemon stopped while the run was active', ended_at_ms = ?"
        " WHERE status = 'running'",
        (now_ms,),
    )
    return cur.rowcount
