"""Each conversation's rendered history prefix, kept across restarts (model.request.RenderedPrefix).

A row holds the element texts one adapter rendered for the first ``message_count`` messages of a
conversation's history, and the SHA-256 of those messages' ids: a later history may use the texts
only when its own first messages have the same ids (an edit branches before them, and the row no
longer matches). Like message_roots, a row is derived data: never the source of truth, replaced
freely, ignored when it does not match or does not parse.
"""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from collections.abc import Iterable, Sequence

import attrs

# Version 7.
V7: tuple[str, ...] = (
    """CREATE TABLE rendered_prefixes (
    conversation_id TEXT NOT NULL,
    render_key BLOB NOT NULL CHECK (length(render_key) = 32),
    message_count INTEGER NOT NULL CHECK (message_count > 0),
    messages_sha256 BLOB NOT NULL CHECK (length(messages_sha256) = 32),
    lengths BLOB NOT NULL,
    texts BLOB NOT NULL,
    PRIMARY KEY (conversation_id, render_key)
)""",
)


_PIECE = 256  # texts written at a time


@attrs.frozen
class StoredRender:
    message_count: int
    messages_sha256: bytes
    texts: tuple[bytes, ...] = attrs.field(repr=False)


def messages_digest(ids: Iterable[bytes]) -> bytes:
    """What a row's ``messages_sha256`` is of: the messages' ids (each the SHA-256 of a message)."""
    return hashlib.sha256(b"".join(ids)).digest()


def save(
    conn: sqlite3.Connection,
    conversation_id: str,
    render_key: bytes,
    message_count: int,
    messages_sha256: bytes,
    texts: Sequence[bytes],
) -> None:
    lengths = struct.pack(f"<{len(texts)}I", *map(len, texts))
    # One row per conversation: its last call's adapter's. Rows under other keys (another
    # adapter, or an older byok's rendering code, never to be read again) go.
    conn.execute(
        "DELETE FROM rendered_prefixes WHERE conversation_id = ? AND render_key != ?",
        (conversation_id, render_key),
    )
    # Written into a zeroblob in pieces, not bound whole: sqlite3 keeps a statement's last bound
    # values until it runs again, and a 5.7 MB one stayed resident (+5.3 MiB RSS, measured).
    cur = conn.execute(
        "INSERT OR REPLACE INTO rendered_prefixes"
        " (conversation_id, render_key, message_count, messages_sha256, lengths, texts)"
        " VALUES (?, ?, ?, ?, ?, zeroblob(?))",
        (conversation_id, render_key, message_count, messages_sha256, lengths, sum(map(len, texts))),
    )
    assert cur.lastrowid is not None
    with conn.blobopen("rendered_prefixes", "texts", cur.lastrowid) as blob:
        for start in range(0, len(texts), _PIECE):
            blob.write(b"".join(texts[start : start + _PIECE]))


def load(conn: sqlite3.Connection, conversation_id: str, render_key: bytes) -> StoredRender | None:
    row = conn.execute(
        "SELECT message_count, messages_sha256, lengths, texts FROM rendered_prefixes"
        " WHERE conversation_id = ? AND render_key = ?",
        (conversation_id, render_key),
    ).fetchone()
    if row is None:
        return None
    count, digest, lengths, joined = row
    if len(lengths) % 4:
        return None
    texts: list[bytes] = []
    at = 0
    for (n,) in struct.iter_unpack("<I", lengths):
        texts.append(joined[at : at + n])
        at += n
    if at != len(joined):
        return None  # not what save wrote: unused, as a row that does not match
    return StoredRender(count, digest, tuple(texts))


def saved(conn: sqlite3.Connection, conversation_id: str, render_key: bytes) -> tuple[int, bytes] | None:
    """(message count, messages digest) of the row, without its texts."""
    row = conn.execute(
        "SELECT message_count, messages_sha256 FROM rendered_prefixes"
        " WHERE conversation_id = ? AND render_key = ?",
        (conversation_id, render_key),
    ).fetchone()
    return None if row is None else (row[0], row[1])
