"""The checkpoint root id byok published for each message, kept across restarts.

Every checkpoint lists the root blob id of every message. Working one out means encoding the
message as Cursor's root JSON and hashing it (~10 us a message, 51 ms at 5,000), so a daemon
that restarts under a long conversation paid that on its first checkpoint. The ids are saved
when a run ends and read back, with the history, by the first run that needs them.

A saved id is a cache, never the source of truth: the run uses it only for a blob the client
says it holds, and otherwise encodes the message again (and saves what it gets), so an id
written by an older encoding cannot put a blob the client lacks into a checkpoint.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from byok.store.revisions import CHAIN_SQL

# Version 5. No foreign key: a row is derived data, and a run's terminal write must not fail on
# one (rows are only ever read joined through a revision's messages).
V5: tuple[str, ...] = (
    """CREATE TABLE message_roots (
    message_id BLOB PRIMARY KEY NOT NULL CHECK (length(message_id) = 32),
    root_id BLOB NOT NULL CHECK (length(root_id) = 32)
) WITHOUT ROWID""",
)

_AT_REVISION_SQL = f"""
{CHAIN_SQL}
SELECT rm.message_id, r.root_id
FROM revision_messages AS rm
JOIN message_roots AS r ON r.message_id = rm.message_id
WHERE rm.revision_id IN chain
"""


def save(conn: sqlite3.Connection, pairs: Iterable[tuple[bytes, bytes]]) -> None:
    """Record ``(message id, root id)`` pairs; a later encoding's id replaces an older one."""
    conn.executemany("INSERT OR REPLACE INTO message_roots (message_id, root_id) VALUES (?, ?)", pairs)


def at_revision(conn: sqlite3.Connection, revision_id: int | None) -> dict[bytes, bytes]:
    """Message id -> saved root id, for the messages of the history at ``revision_id``."""
    if revision_id is None:
        return {}
    return dict(conn.execute(_AT_REVISION_SQL, (revision_id,)).fetchall())
