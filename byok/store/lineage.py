"""Revision lineage queries: ancestors by message count, revisions of any branch by message
count, the turn list a revision published,
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

# Both walks stop at what they look for. Every append makes a revision, so a long conversation's
# chain holds thousands: walking all of them and sorting by depth cost 8 ms at 5,000 revisions,
# inside every user turn's first store trip. A revision's parent always holds fewer messages
# (append needs at least one), so the count walk can stop once it is at or below the count.
_ANCESTOR_SQL = """WITH RECURSIVE chain(id, parent_id, message_count) AS (
    SELECT id, parent_id, message_count FROM revisions WHERE id = ?
    UNION ALL
    SELECT r.id, r.parent_id, r.message_count
    FROM chain c JOIN revisions r ON r.id = c.parent_id
    WHERE c.message_count > ?
)
SELECT id FROM chain WHERE message_count = ?"""

# The nearest revision on the chain that recorded a turn list; the walk ends there.
_TURNS_SQL = """WITH RECURSIVE chain(parent_id, turns) AS (
    SELECT r.parent_id, t.turns
    FROM revisions r LEFT JOIN revision_turns t ON t.revision_id = r.id WHERE r.id = ?
    UNION ALL
    SELECT r.parent_id, t.turns
    FROM chain c JOIN revisions r ON r.id = c.parent_id
    LEFT JOIN revision_turns t ON t.revision_id = r.id
    WHERE c.turns IS NULL
)
SELECT turns FROM chain WHERE turns IS NOT NULL"""


# The revisions of a conversation, on any branch, whose history has exactly N messages, each with
# its last message (a revision appends at least one, so it is always the revision's own row).
_ENDING_SQL = """SELECT r.id, m.id, m.data
FROM revisions AS r
JOIN revision_messages AS rm ON rm.revision_id = r.id AND rm.ordinal = r.message_count - 1
JOIN messages AS m ON m.id = rm.message_id
WHERE r.conversation_id = ? AND r.message_count = ?
ORDER BY r.id DESC"""


def revisions_with_count(
    conn: sqlite3.Connection, conversation_id: str, count: int
) -> list[tuple[int, bytes, bytes]]:
    """(revision, its last message's id and data) for every revision of the conversation, on
    any branch, whose history has exactly ``count`` messages; newest first."""
    if count == 0:
        return []
    rows = conn.execute(_ENDING_SQL, (conversation_id, count)).fetchall()
    return [(int(r), bytes(mid), bytes(data)) for r, mid, data in rows]


def ancestor_with_count(conn: sqlite3.Connection, revision_id: int | None, count: int) -> int | None:
    """The revision on ``revision_id``'s chain whose history has exactly ``count`` messages."""
    if count == 0 or revision_id is None:
        return None
    row = conn.execute(_ANCESTOR_SQL, (revision_id, count, count)).fetchone()
    if row is None:
        raise LookupError(f"no ancestor of revision {revision_id} has {count} messages")
    return int(row[0])


def turns_at(conn: sqlite3.Connection, revision_id: int | None) -> tuple[bytes, ...]:
    """The turn list recorded at the nearest revision on the chain (failed runs record none)."""
    if revision_id is None:
        return ()
    row = conn.execute(_TURNS_SQL, (revision_id,)).fetchone()
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
