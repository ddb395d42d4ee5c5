"""Request bodies of provider calls, stored as tails of the previous call's.

Consecutive calls of a conversation share almost all of their bytes: a request is the previous
request's messages plus the new ones (the prefix property), so at 5,000 messages each call's
5.7 MB body differed from the one before in a few kilobytes, and storing every body whole grew
the database by the square of the conversation's length. A call whose body starts with
``shared_bytes`` bytes of an earlier call's stored body keeps only the rest, with a reference to
that call; the full body is rebuilt on read. Chains are capped at ``MAX_CHAIN`` hops (then a
body is stored whole again), so a read touches at most that many rows.

The ``llm_call_bodies`` view gives every call's full body in SQL, for people reading the
database by hand. A row of it walks that call's own chain, so ``WHERE id = ?`` reads at most
``MAX_CHAIN`` rows however long the call log is.
"""

from __future__ import annotations

import sqlite3

from byok.model.body import Body, as_bytes, view

# Version 4: bodies stored as tails. NULL base: request_body is the whole body (every older row).
V4: tuple[str, ...] = (
    "ALTER TABLE llm_calls ADD COLUMN body_base_id INTEGER REFERENCES llm_calls(id)",
    "ALTER TABLE llm_calls ADD COLUMN body_shared_bytes INTEGER",
    "ALTER TABLE llm_calls ADD COLUMN body_depth INTEGER NOT NULL DEFAULT 0",
    # substr on a BLOB counts bytes; || makes text, cast back so the next hop counts bytes again.
    """CREATE VIEW llm_call_bodies (id, request_body) AS
WITH RECURSIVE b(id, body) AS (
    SELECT id, request_body FROM llm_calls WHERE body_base_id IS NULL
    UNION ALL
    SELECT c.id, CAST(substr(b.body, 1, c.body_shared_bytes) || c.request_body AS BLOB)
    FROM llm_calls AS c JOIN b ON c.body_base_id = b.id
)
SELECT id, body FROM b""",
)

# Version 8: the view rebuilds each row from its own chain. Version 4's built every body of the
# database from the whole ancestors down and then filtered, so one lookup cost as much as reading
# all of them (485 ms with 3,592 calls, growing with the log). Here a row walks up from its call:
# ``keep`` is how many bytes of the current row's full body the wanted body takes (-1: all of it),
# ``tail`` the wanted body's bytes after those, gathered hop by hop; the whole ancestor adds its
# first ``keep`` bytes last, so the large body is copied once. ``ok`` checks every claimed prefix
# against the length of the body it is taken from, as full_body does: a chain that claims more
# than its base holds, or that breaks, reads as NULL, never as made-up bytes. Depth is bounded
# against a cycle in a damaged file. A body that fits whole is taken whole, never cut with
# substr: SQLite's substr of an empty BLOB is NULL.
V8: tuple[str, ...] = (
    "DROP VIEW llm_call_bodies",
    """CREATE VIEW llm_call_bodies (id, request_body) AS
SELECT c.id, (
    WITH RECURSIVE up(id, base, shared, depth, keep, ok, tail) AS (
        SELECT c.id, c.body_base_id, c.body_shared_bytes, 0, -1, 1, x''
        UNION ALL
        SELECT p.id, p.body_base_id, p.body_shared_bytes, up.depth + 1,
            CASE WHEN up.keep < 0 THEN up.shared ELSE min(up.keep, up.shared) END,
            up.ok AND coalesce(p.body_shared_bytes, 0) + length(p.request_body) >= up.shared,
            CAST((SELECT CASE WHEN up.keep < 0 OR length(t.request_body) <= up.keep - up.shared
                         THEN t.request_body
                         ELSE substr(t.request_body, 1, max(0, up.keep - up.shared)) END
                  FROM llm_calls AS t WHERE t.id = up.id) || up.tail AS BLOB)
        FROM up JOIN llm_calls AS p ON p.id = up.base
        WHERE up.depth < 64
    )
    SELECT CASE WHEN up.ok THEN CAST(
        (SELECT CASE WHEN up.keep < 0 OR length(r.request_body) <= up.keep THEN r.request_body
                ELSE substr(r.request_body, 1, up.keep) END
         FROM llm_calls AS r WHERE r.id = up.id) || up.tail AS BLOB) END
    FROM up WHERE up.base IS NULL
) FROM llm_calls AS c""",
)

# Version 6: each call's compared prefix (LlmCallRecord.compared_*), so the call after a restart
# is checked against 44 bytes instead of its predecessor's body read back and walked.
V6: tuple[str, ...] = (
    "ALTER TABLE llm_calls ADD COLUMN compared_bytes INTEGER",
    "ALTER TABLE llm_calls ADD COLUMN compared_messages INTEGER",
    "ALTER TABLE llm_calls ADD COLUMN compared_sha256 BLOB",
)

# Hops from a stored body to its whole ancestor; the next call is stored whole.
MAX_CHAIN = 32
# Below this many shared bytes a tail is not worth a reference.
MIN_SHARED = 4096


def stored_form(
    conn: sqlite3.Connection, conversation_id: str, body: Body | None, base_id: int | None, shared: int
) -> tuple[bytes | None, int | None, int | None, int]:
    """(bytes to store, base id, shared bytes, depth) for ``body``, given the caller's claim that
    it starts with ``shared`` bytes of call ``base_id``'s body. The claim is used only when that
    call is of the same conversation and its chain has room; otherwise the body is stored whole."""
    if body is None or base_id is None or not MIN_SHARED <= shared <= len(body):
        return None if body is None else as_bytes(body), None, None, 0
    # typeof() reads the column's type from the row header; "request_body IS NOT NULL" loaded
    # the whole base body (+4.4 MiB RSS in bench 5 when it was a 5.7 MB body stored whole).
    row = conn.execute(
        "SELECT body_depth, conversation_id, typeof(request_body) != 'null' FROM llm_calls WHERE id = ?",
        (base_id,),
    ).fetchone()
    if row is None or row[1] != conversation_id or not row[2] or row[0] + 1 >= MAX_CHAIN:
        return as_bytes(body), None, None, 0
    return bytes(view(body, shared, len(body))), base_id, shared, row[0] + 1


def full_body(
    conn: sqlite3.Connection, stored: bytes | None, base_id: int | None, shared: int | None
) -> bytes | None:
    """The whole body of a call stored as ``stored`` (its tail when ``base_id`` is set)."""
    if base_id is None or stored is None:
        return stored
    # Walk to the whole ancestor, then apply the hops oldest first: each keeps a prefix of the
    # body so far and appends its tail. Pieces are sliced as views and joined once.
    hops: list[tuple[int, bytes]] = [(shared or 0, stored)]
    root: bytes | None = None
    at: int | None = base_id
    for _ in range(MAX_CHAIN + 1):
        if at is None:
            break
        row = conn.execute(
            "SELECT request_body, body_base_id, body_shared_bytes FROM llm_calls WHERE id = ?", (at,)
        ).fetchone()
        if row is None or row[0] is None:
            return None  # a broken chain: the body is unknown, never made up
        if row[1] is None:
            root = row[0]
            break
        hops.append((row[2], row[0]))
        at = row[1]
    if root is None:
        return None
    pieces: list[memoryview] = [memoryview(root)]
    for keep, tail in reversed(hops):
        kept = _truncate(pieces, keep)
        if kept is None:
            return None  # shorter than the prefix its successor claims: unknown, not made up
        pieces = [*kept, memoryview(tail)]
    return b"".join(pieces)


def _truncate(pieces: list[memoryview], size: int) -> list[memoryview] | None:
    out: list[memoryview] = []
    left = size
    for piece in pieces:
        if left <= 0:
            break
        out.append(piece[:left])
        left -= len(piece)
    return None if left > 0 else out
