"""The ``llm_call_bodies`` view people read the database with: each row is the body full_body
rebuilds (NULL where full_body cannot tell it), and a lookup by id reads only its own chain."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from byok.store import SQLiteStore, call_bodies, schema
from tests.support.vm_steps import vm_steps

INSERT = (
    "INSERT INTO llm_calls (id, request_id, conversation_id, provider_id, model, request_body,"
    " request_sha256, messages_sha256, status, event_count, byte_count, started_at_ms,"
    " body_base_id, body_shared_bytes, body_depth)"
    " VALUES (?, 'r', ?, 'p', 'm', ?, 'aa', 'bb', 'ok', 0, 0, 1, ?, ?, 0)"
)


def database(version: int = schema.SCHEMA_VERSION, path: Path | str = ":memory:") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for statements in schema.MIGRATIONS[:version]:
        for statement in statements:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {version}")
    return conn  # foreign keys off: damaged chains can be written, as in a damaged file


def add(
    conn: sqlite3.Connection,
    row_id: int,
    stored: bytes | None,
    base: int | None = None,
    shared: int | None = None,
    conversation: str = "c",
) -> None:
    conn.execute(INSERT, (row_id, conversation, stored, base, shared))


def view(conn: sqlite3.Connection, row_id: int) -> bytes | None:
    (body,) = conn.execute("SELECT request_body FROM llm_call_bodies WHERE id = ?", (row_id,)).fetchone()
    return body


def rebuilt(conn: sqlite3.Connection, row_id: int) -> bytes | None:
    stored, base, shared = conn.execute(
        "SELECT request_body, body_base_id, body_shared_bytes FROM llm_calls WHERE id = ?", (row_id,)
    ).fetchone()
    return call_bodies.full_body(conn, stored, base, shared)


def test_chains_branches_and_damage() -> None:
    conn = database()
    add(conn, 1, b"0123456789")
    add(conn, 2, b"abc", 1, 4)  # 0123abc
    add(conn, 3, b"XY", 2, 6)  # 0123abXY
    add(conn, 4, b"!", 1, 10)  # a branch of 1: 0123456789!
    add(conn, 5, b"", 3, 2)  # 01
    add(conn, 6, b"tail", 99, 2)  # its base is gone
    add(conn, 7, b"tail", 2, 8)  # claims 8 bytes of a 7-byte body
    add(conn, 8, None)  # a whole body never stored
    add(conn, 9, b"tail", 8, 0)
    add(conn, 10, b"z", 7, 1)  # below a made-up claim
    expected = {
        1: b"0123456789",
        2: b"0123abc",
        3: b"0123abXY",
        4: b"0123456789!",
        5: b"01",
        6: None,
        7: None,
        8: None,
        9: None,
        10: None,
    }
    assert {i: view(conn, i) for i in expected} == expected
    assert {i: rebuilt(conn, i) for i in expected} == expected


def test_a_cycle_in_a_damaged_file_reads_as_null() -> None:
    conn = database()
    add(conn, 1, b"a", 2, 0)
    add(conn, 2, b"b", 1, 0)
    assert view(conn, 1) is None


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_row_is_what_full_body_rebuilds(data: st.DataObject) -> None:
    conn = database()
    count = data.draw(st.integers(1, 12))
    for row_id in range(1, count + 1):
        stored = data.draw(st.one_of(st.none(), st.binary(max_size=12)), label=f"stored {row_id}")
        base = data.draw(st.one_of(st.none(), st.integers(1, count + 1)), label=f"base {row_id}")
        shared = None if base is None else data.draw(st.integers(0, 30), label=f"shared {row_id}")
        add(conn, row_id, stored, base, shared)
    for row_id in range(1, count + 1):
        # full_body walks at most MAX_CHAIN + 1 hops; the generated chains stay shorter.
        assert view(conn, row_id) == rebuilt(conn, row_id)


def test_a_lookup_reads_only_its_own_chain() -> None:
    conn = database()
    body = b"x" * 5000
    add(conn, 1, body)
    for row_id in range(2, 6):
        add(conn, row_id, b"+%d" % row_id, row_id - 1, 5000 + 2 * (row_id - 2))
    alone = vm_steps(conn, lambda: view(conn, 5))
    # 300 calls of other conversations, chained too: a body's lookup does not touch them.
    for row_id in range(100, 400):
        if row_id % 10 == 0:
            add(conn, row_id, body, conversation=f"o{row_id // 10}")
        else:
            add(conn, row_id, b"+", row_id - 1, 5000 + row_id % 10 - 1, conversation=f"o{row_id // 10}")
    assert vm_steps(conn, lambda: view(conn, 5)) == alone
    assert view(conn, 5) == body + b"+2+3+4+5"


def test_a_version_7_database_gets_the_view(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    conn = database(7, path)
    add(conn, 1, b"0123456789")
    add(conn, 2, b"abc", 1, 4)
    add(conn, 3, b"tail", 2, 99)  # made up: version 7's view gave 0123abctail
    assert view(conn, 3) == b"0123abctail"
    conn.close()
    with SQLiteStore(path) as store:
        assert store._conn is not None
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 9
        assert [view(store._conn, i) for i in (1, 2, 3)] == [b"0123456789", b"0123abc", None]
