"""The bytes of the images messages carry: kept in the blob table (id = SHA-256 of the bytes), so
a message's row holds only its references (model/images.py) and an image pasted again, or read
again, is stored once.

Written in the transaction that appends the message; given back to a message whenever its
history is read. An image whose bytes are neither at hand nor stored is refused at the append,
and a stored message whose image went missing is a corrupt history, never a silently
image-less message sent to a provider.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Sequence

from byok.model.messages import Message
from byok.store.blobs import has_blobs
from byok.store.errors import StoreError

_CHUNK = 500  # ids per IN (...) query, under SQLite's variable limit


def save_images(conn: sqlite3.Connection, messages: Iterable[Message], now_ms: int) -> None:
    rows: dict[bytes, bytes] = {}
    without: set[bytes] = set()
    for m in messages:
        for part in m.attachments:
            blob_id = part.blob_id
            if part.data:
                if len(part.data) != part.size or hashlib.sha256(part.data).digest() != blob_id:
                    raise StoreError(f"image {part.sha256[:12]}: its bytes do not match its reference")
                rows[blob_id] = part.data
            else:
                without.add(blob_id)
    missing = without - rows.keys() - has_blobs(conn, without) if without else set()
    if missing:
        listed = ", ".join(sorted(b.hex()[:12] for b in missing))
        raise StoreError(f"image(s) {listed} have no bytes to store")
    if rows:
        conn.executemany(
            "INSERT OR IGNORE INTO blobs (id, data, size_bytes, created_at_ms) VALUES (?, ?, ?, ?)",
            [(blob_id, data, len(data), now_ms) for blob_id, data in rows.items()],
        )


def load_images(conn: sqlite3.Connection, messages: Sequence[Message]) -> None:
    """Give each of ``messages``' image parts its bytes from the blob table."""
    wanted = sorted({p.blob_id for m in messages for p in m.attachments})
    found: dict[str, bytes] = {}
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        rows = conn.execute(f"SELECT id, data FROM blobs WHERE id IN ({', '.join('?' * len(chunk))})", chunk)
        found.update((bytes(blob_id).hex(), bytes(data)) for blob_id, data in rows)
    missing = [b.hex() for b in wanted if b.hex() not in found]
    if missing:
        raise StoreError(f"the history is corrupt: image {missing[0][:12]} of a message is not stored")
    for m in messages:
        m.give_image_data(found.__getitem__)
