"""Content-addressed blobs (id = sha256 of the exact bytes received) and the edges between them.

Functions take a connection already inside the right transaction; SQLiteStore owns transactions.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Sequence

from byok.store.errors import StoreError
from byok.store.records import BlobEdge

# Well under SQLITE_MAX_VARIABLE_NUMBER on every SQLite still in the wild (999 before 3.32).
_CHUNK = 500


def verify_blobs(blobs: Sequence[tuple[bytes, bytes]]) -> None:
    """Raise ValueError before anything is written if any id is not the SHA-256 of its bytes."""
    for blob_id, data in blobs:
        if len(blob_id) != 32:
            raise ValueError(f"blob id must be 32 bytes, got {len(blob_id)}")
        if hashlib.sha256(data).digest() != blob_id:
            raise ValueError(f"blob {blob_id.hex()} does not match the SHA-256 of its {len(data)} bytes")


def put_blobs(
    conn: sqlite3.Connection,
    blobs: Sequence[tuple[bytes, bytes]],
    now_ms: int,
    edges: Sequence[BlobEdge],
) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO blobs (id, data, size_bytes, created_at_ms) VALUES (?, ?, ?, ?)",
        [(blob_id, data, len(data), now_ms) for blob_id, data in blobs],
    )
    if not edges:
        return
    # Checked up front for a readable error; the foreign keys would only say "constraint failed".
    ends = {e.parent_id for e in edges} | {e.child_id for e in edges}
    missing = ends - has_blobs(conn, ends)
    if missing:
        listed = ", ".join(sorted(m.hex() for m in missing))
        raise StoreError(f"blob edges reference blobs that are not stored: {listed}")
    conn.executemany(
        "INSERT OR IGNORE INTO blob_edges (parent_id, child_id, kind, ordinal) VALUES (?, ?, ?, ?)",
        [(e.parent_id, e.child_id, e.kind, e.ordinal) for e in edges],
    )


def get_blob(conn: sqlite3.Connection, blob_id: bytes) -> bytes | None:
    row = conn.execute("SELECT data FROM blobs WHERE id = ?", (blob_id,)).fetchone()
    return None if row is None else bytes(row[0])


def has_blobs(conn: sqlite3.Connection, ids: Iterable[bytes]) -> set[bytes]:
    wanted = list(set(ids))
    found: set[bytes] = set()
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        rows = conn.execute(
            f"SELECT id FROM blobs WHERE id IN ({', '.join('?' * len(chunk))})", chunk
        ).fetchall()
        found.update(bytes(r[0]) for r in rows)
    return found
