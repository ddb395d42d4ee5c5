"""Conversation heads and revision histories: the compare-and-swap claim, head moves, and reading
one revision's history back from SQLite (uncached; SQLiteStore keeps the decoded-history cache).

Functions take a connection already inside the right transaction; SQLiteStore owns transactions.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from byok.model.messages import ATTACHMENTS_PREFIX, Message
from byok.store.errors import StaleRevision, StoreError
from byok.store.images import load_images

# The revisions making up one history: the parent chain from a revision (the parameter) to the root.
CHAIN_SQL = """WITH RECURSIVE chain(id) AS (
    SELECT ?
    UNION ALL
    SELECT r.parent_id FROM revisions AS r JOIN chain ON r.id = chain.id WHERE r.parent_id IS NOT NULL
)"""
# Every appended message of that chain in absolute order. A revision's parent is always an older
# row (a smaller AUTOINCREMENT id), so ordering by (revision_id, ordinal) is ordinal order and
# follows revision_messages' primary key: no temporary B-tree sorting 5,000 rows of message data
# (21 ms -> 8 ms at 5,000 messages).
_HISTORY_SQL = f"""
{CHAIN_SQL}
SELECT rm.ordinal, m.id, m.data
FROM revision_messages AS rm
JOIN messages AS m ON m.id = rm.message_id
WHERE rm.revision_id IN chain
ORDER BY rm.revision_id, rm.ordinal
"""


def head_row(conn: sqlite3.Connection, conversation_id: str) -> tuple[int | None, int] | None:
    """(head revision, version), or None when the conversation does not exist yet."""
    row = conn.execute(
        "SELECT head_revision, version FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def claim(conn: sqlite3.Connection, conversation_id: str, expected_version: int, now_ms: int) -> int | None:
    """The compare-and-swap check; returns the current head revision. Atomic with the write
    that follows because BEGIN IMMEDIATE already holds the database's write lock."""
    row = head_row(conn, conversation_id)
    if row is None:
        if expected_version != 0:
            raise StaleRevision(conversation_id, expected_version, 0)
        conn.execute(
            "INSERT INTO conversations (conversation_id, head_revision, version, created_at_ms,"
            " updated_at_ms) VALUES (?, NULL, 0, ?, ?)",
            (conversation_id, now_ms, now_ms),
        )
        return None
    head_revision, version = row
    if version != expected_version:
        raise StaleRevision(conversation_id, expected_version, version)
    return head_revision


def set_head(conn: sqlite3.Connection, conversation_id: str, revision_id: int | None, now_ms: int) -> None:
    conn.execute(
        "UPDATE conversations SET head_revision = ?, version = version + 1, updated_at_ms = ?"
        " WHERE conversation_id = ?",
        (revision_id, now_ms, conversation_id),
    )


def event_seen(conn: sqlite3.Connection, conversation_id: str, event_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM runtime_events WHERE conversation_id = ? AND event_id = ?",
        (conversation_id, event_id),
    ).fetchone()
    return row is not None


def message_count(conn: sqlite3.Connection, revision_id: int | None) -> int:
    if revision_id is None:
        return 0
    row = conn.execute("SELECT message_count FROM revisions WHERE id = ?", (revision_id,)).fetchone()
    if row is None:
        raise StoreError(f"unknown revision {revision_id}")
    return int(row[0])


_DECODE_BATCH = 256


def read_history(conn: sqlite3.Connection, revision_id: int) -> tuple[Message, ...]:
    """The whole history at ``revision_id`` from SQLite, each message decoded on its first read."""
    count = message_count(conn, revision_id)
    cursor = conn.execute(_HISTORY_SQL, (revision_id,))
    out: list[Message] = []
    with_images: list[Message] = []
    one: Callable[[Any, Any], Any] = {}.setdefault  # one string per distinct id (Message._from_obj)
    # In batches: a history's rows, their joined text and its parse are alive together only one
    # batch at a time (decoded whole, 5,000 messages peaked at 21 MiB for a 7 MiB result).
    while rows := cursor.fetchmany(_DECODE_BATCH):
        # Transactions make a gap impossible; checking is cheap and turns corruption into an
        # error instead of a silently shortened history sent to a provider.
        first = len(out)
        if any(row[0] != first + i for i, row in enumerate(rows)):
            raise StoreError(f"revision {revision_id} is corrupt: expected {count} messages in order")
        # The row's key is SHA-256 of these very bytes: a checkpoint need not re-encode the
        # whole history (and keep a second copy of it) just to learn the ids. Each message is
        # decoded when first read (Message.stored).
        out += [Message.stored(message_id, data, one) for _, message_id, data in rows]
        # A message with images is told by its first bytes (a startswith per row, no parse).
        with_images += [out[first + i] for i, row in enumerate(rows) if row[2].startswith(ATTACHMENTS_PREFIX)]
    if len(out) != count:
        raise StoreError(f"revision {revision_id} is corrupt: expected {count} messages in order")
    if with_images:
        load_images(conn, with_images)
    return tuple(out)
