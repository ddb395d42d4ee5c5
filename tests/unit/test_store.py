"""SQLiteStore: revisions, compare-and-swap, exactly-once events, anchors, runs, calls, blobs."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from byok.model.messages import Message, ReplayState, ToolCall
from byok.model.usage import Usage
from byok.store import (
    DB_FILENAME,
    BlobEdge,
    Head,
    LlmCallRecord,
    SQLiteStore,
    StaleRevision,
    StoreError,
)
from byok.store.schema import PAGE_SIZE, SCHEMA_VERSION, WAL_AUTOCHECKPOINT_BYTES


def user(text: str) -> Message:
    return Message(role="user", origin="user", text=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", origin="assistant", text=text)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / DB_FILENAME


@pytest.fixture
def store(path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(path) as s:
        yield s


# -- opening ---------------------------------------------------------------------------------------


def test_open_sets_pragmas_and_schema_version(store: SQLiteStore, path: Path) -> None:
    conn = store._conn
    assert conn is not None
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 16384
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_AUTOCHECKPOINT_BYTES // PAGE_SIZE
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_database_made_with_smaller_pages_keeps_them_and_works(tmp_path: Path) -> None:
    """Databases created before PAGE_SIZE have SQLite's default 4 KiB pages: WAL mode cannot
    change that, and nothing needs it changed."""
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size=4096")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    with SQLiteStore(path) as s:
        assert s._conn is not None
        assert s._conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert s._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_AUTOCHECKPOINT_BYTES // 4096
        s.append("c", 0, [user("x" * 100_000)], 1)
    with SQLiteStore(path) as s:
        assert [m.text for m in s.head("c").messages] == ["x" * 100_000]


def test_big_appends_stay_in_the_wal_until_a_checkpoint(store: SQLiteStore, path: Path) -> None:
    """No checkpoint inside a turn's commits (SQLite's default would run one every ~4 MB of
    WAL, inside whichever append crossed it), nor when the run finishes; checkpoint_wal (which
    the daemon runs once the store is quiet) moves the pages into the database."""
    store.start_run("r1", "c", "m", 1)
    before = path.stat().st_size
    version = 0
    for i in range(4):
        version = store.append("c", version, [user(f"{i}" * 3_000_000)], 2).version
    store.finish_run("r1", "success", 3)
    assert path.stat().st_size - before < 1_000_000  # all of it still in the WAL
    store.checkpoint_wal()
    assert path.stat().st_size - before > 12_000_000
    assert [len(m.text) for m in store.head("c").messages] == [3_000_000] * 4


def test_reopen_keeps_data(path: Path) -> None:
    with SQLiteStore(path) as s:
        s.append("c", 0, [user("hi")], 1)
    with SQLiteStore(path) as s:
        assert s.head("c").messages == (user("hi"),)


def test_newer_schema_version_is_refused(path: Path) -> None:
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this byok supports"):
        SQLiteStore(path)


def test_open_in_creates_private_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "a" / "data"
    with SQLiteStore.open_in(data_dir) as s:
        assert s.path == data_dir / DB_FILENAME
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700


def test_closed_store_raises(path: Path) -> None:
    s = SQLiteStore(path)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.head("c")


# -- history ---------------------------------------------------------------------------------------


def test_unknown_conversation_is_empty(store: SQLiteStore) -> None:
    assert store.head("nope") == Head("nope", None, 0, ())


def test_append_creates_conversation_and_extends_history(store: SQLiteStore) -> None:
    h1 = store.append("c", 0, [user("a"), assistant("b")], 10)
    assert (h1.version, h1.messages) == (1, (user("a"), assistant("b")))
    h2 = store.append("c", 1, [user("c")], 11)
    assert h2.version == 2
    assert h2.messages == (user("a"), assistant("b"), user("c"))
    assert store.head("c") == h2
    assert store.messages_at(h1.revision_id) == h1.messages  # type: ignore[arg-type]
    assert store.head("other") == Head("other", None, 0, ())


def test_append_round_trips_every_field(path: Path) -> None:
    rich = Message(
        role="assistant",
        origin="assistant",
        text="t",
        thinking="th",
        replay=ReplayState("anthropic", '{"sig":"x"}'),
        tool_calls=(ToolCall("c1", "read", '{"p":1}', 0), ToolCall("c2", "ls", "{}", 1)),
        tool_round_id="r",
        model_call_id="m",
    )
    result = Message(
        role="tool", origin="tool", text="ok", tool_call_id="c1", tool_name="read", is_error=True
    )
    with SQLiteStore(path) as s:
        head = s.append("c", 0, [rich, result], 1)
    with SQLiteStore(path) as s:  # cold: nothing cached
        again = s.head("c")
    assert again == head
    assert [m.encode() for m in again.messages] == [rich.encode(), result.encode()]


def test_identical_messages_are_stored_once_but_kept_in_history(store: SQLiteStore) -> None:
    store.append("c", 0, [user("same"), user("same")], 1)
    head = store.append("c", 1, [user("same")], 2)
    assert head.messages == (user("same"),) * 3
    assert store._conn is not None
    assert store._conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1


def test_append_needs_messages(store: SQLiteStore) -> None:
    with pytest.raises(ValueError):
        store.append("c", 0, [], 1)


def test_stale_version_is_rejected_and_writes_nothing(store: SQLiteStore) -> None:
    store.append("c", 0, [user("a")], 1)
    with pytest.raises(StaleRevision) as info:
        store.append("c", 0, [user("late")], 2, event_id="e", input_id="i")
    assert (info.value.expected_version, info.value.actual_version) == (0, 1)
    with pytest.raises(StaleRevision):
        store.append("c", 5, [user("late")], 2)
    with pytest.raises(StaleRevision):
        store.append("new", 1, [user("late")], 2)
    assert store.head("c").messages == (user("a"),)
    assert store.head("new").version == 0
    assert store.runtime_event_message("c", "e") is None
    assert store.input_anchor("c", "i") == (False, None)


def test_runtime_event_is_appended_exactly_once(store: SQLiteStore) -> None:
    store.append("c", 0, [user("hello")], 1)
    runtime = Message(role="user", origin="runtime", text="<reminder>", event_id="ev1")
    first = store.append("c", 1, [runtime, assistant("ack")], 2, event_id="ev1")
    assert first.version == 2
    # A retry with the same event id, even with a stale version, replays instead of appending.
    again = store.append(
        "c", 1, [Message(role="user", origin="runtime", text="re-rendered")], 3, event_id="ev1"
    )
    assert again == first
    assert store.head("c") == first
    assert store.runtime_event_message("c", "ev1") == runtime
    assert store.runtime_event_message("c", "ev2") is None
    # Event ids are scoped per conversation.
    other = store.append("d", 0, [runtime], 4, event_id="ev1")
    assert other.version == 1
    assert store.runtime_event_message("d", "ev1") == runtime


def test_input_anchor_records_the_revision_before_first_append(store: SQLiteStore) -> None:
    assert store.input_anchor("c", "in1") == (False, None)
    h1 = store.append("c", 0, [user("first")], 1, input_id="in1")
    assert store.input_anchor("c", "in1") == (True, None)
    h2 = store.append("c", 1, [assistant("reply")], 2)
    h3 = store.append("c", 2, [user("second")], 3, input_id="in2")
    assert store.input_anchor("c", "in2") == (True, h2.revision_id)
    # Seeing the input again later does not move its anchor.
    store.append("c", 3, [user("second, retried")], 4, input_id="in2")
    assert store.input_anchor("c", "in2") == (True, h2.revision_id)
    assert store.input_anchor("other", "in2") == (False, None)
    assert h1.revision_id != h3.revision_id


def test_edit_branches_from_the_anchor_and_keeps_the_old_branch(store: SQLiteStore) -> None:
    store.append("c", 0, [user("q1")], 1, input_id="in1")
    h2 = store.append("c", 1, [assistant("a1")], 2)
    h3 = store.append("c", 2, [user("q2")], 3, input_id="in2")
    old = store.append("c", 3, [assistant("a2")], 4)

    found, anchor = store.input_anchor("c", "in2")
    assert found and anchor == h2.revision_id
    moved = store.move_head("c", 4, anchor, 5)
    assert (moved.version, moved.messages) == (5, (user("q1"), assistant("a1")))
    branched = store.append("c", 5, [user("q2 edited")], 6)
    assert branched.messages == (user("q1"), assistant("a1"), user("q2 edited"))
    assert store.messages_at(old.revision_id) == old.messages  # type: ignore[arg-type]
    assert store.messages_at(h3.revision_id)[-1] == user("q2")  # type: ignore[arg-type]

    # Editing the very first input moves to the empty conversation.
    assert store.input_anchor("c", "in1") == (True, None)
    empty = store.move_head("c", 6, None, 7)
    assert empty == Head("c", None, 7, ())
    assert store.append("c", 7, [user("fresh")], 8).messages == (user("fresh"),)


def test_move_head_checks_version_and_ownership(store: SQLiteStore) -> None:
    h = store.append("c", 0, [user("a")], 1)
    d = store.append("d", 0, [user("b")], 1)
    with pytest.raises(StaleRevision):
        store.move_head("c", 0, h.revision_id, 2)
    with pytest.raises(StoreError, match="does not belong"):
        store.move_head("c", 1, d.revision_id, 2)
    with pytest.raises(StoreError, match="does not belong"):
        store.move_head("c", 1, 999_999, 2)
    assert store.head("c") == h


def test_messages_at_unknown_revision(store: SQLiteStore) -> None:
    with pytest.raises(StoreError, match="unknown revision"):
        store.messages_at(12345)


def test_five_thousand_messages_load_fast_and_in_order(path: Path) -> None:
    expected: list[Message] = []
    with SQLiteStore(path) as s:
        version = 0
        for i in range(0, 5000, 5):  # 1,000 revisions
            batch = [user(f"u{i}")] + [assistant(f"a{i + k}") for k in range(1, 5)]
            expected.extend(batch)
            version = s.append("big", version, batch, i).version
    with SQLiteStore(path) as s:  # cold, so the load really walks 1,000 revisions
        start = time.perf_counter()
        head = s.head("big")
        elapsed = time.perf_counter() - start
    assert head.version == 1000
    assert head.messages == tuple(expected)
    assert elapsed < 1.0, f"loading 5,000 messages took {elapsed:.3f}s"


# -- runs and provider calls -----------------------------------------------------------------------


def test_run_lifecycle_is_written_once(store: SQLiteStore) -> None:
    assert store.run("r1") is None
    store.start_run("r1", "c", "gpt-x", 100)
    running = store.run("r1")
    assert running is not None and running.status == "running" and running.ended_at_ms is None
    usage = Usage(1200, 300, cache_read_tokens=1000, reasoning_tokens=50)
    store.finish_run("r1", "success", 250, usage=usage)
    done = store.run("r1")
    assert done is not None
    assert (done.status, done.started_at_ms, done.ended_at_ms, done.usage) == ("success", 100, 250, usage)
    with pytest.raises(StoreError, match="already ended"):
        store.finish_run("r1", "canceled", 300)
    assert store.run("r1") == done


def test_run_errors(store: SQLiteStore) -> None:
    store.start_run("r1", "c", "m", 1)
    with pytest.raises(StoreError, match="already exists"):
        store.start_run("r1", "c", "m", 2)
    with pytest.raises(StoreError, match="unknown run"):
        store.finish_run("nope", "error", 2)
    with pytest.raises(ValueError):
        store.finish_run("r1", "running", 2)  # type: ignore[arg-type]
    store.finish_run("r1", "error", 3, error_code="provider_error", error_message="429 from upstream")
    rec = store.run("r1")
    assert rec is not None
    assert (rec.status, rec.error_code, rec.error_message, rec.usage) == (
        "error",
        "provider_error",
        "429 from upstream",
        None,
    )


def test_llm_calls_round_trip_in_order(store: SQLiteStore) -> None:
    first = LlmCallRecord(
        request_id="r1",
        conversation_id="c",
        provider_id="openai",
        model="gpt-x",
        request_body=b'{"model":"gpt-x","api_key":"[redacted]"}',
        request_sha256="ab" * 32,
        messages_sha256="cd" * 32,
        status="ok",
        started_at_ms=1000,
        duration_ms=900,
        http_status=200,
        ttfb_ms=120,
        ttft_ms=150,
        event_count=42,
        byte_count=4096,
        usage=Usage(10, 20, 0, 5, None),
    )
    second = LlmCallRecord(
        request_id="r1",
        conversation_id="c",
        provider_id="openai",
        model="gpt-x",
        request_body=None,
        request_sha256="ef" * 32,
        messages_sha256="01" * 32,
        status="error",
        started_at_ms=2000,
        error="connection reset",
    )
    id1 = store.record_llm_call(first)
    id2 = store.record_llm_call(second)
    store.record_llm_call(LlmCallRecord("r2", "c", "p", "m", None, "", "", "canceled", 3))
    assert id1 < id2
    assert store.llm_calls("r1") == [attrs.evolve(first, id=id1), attrs.evolve(second, id=id2)]
    assert store.llm_calls("none") == []


# -- blobs -----------------------------------------------------------------------------------------


def blob(data: bytes) -> tuple[bytes, bytes]:
    return hashlib.sha256(data).digest(), data


def test_blobs_put_get_has(store: SQLiteStore) -> None:
    a, b = blob(b"alpha"), blob(b"")
    store.put_blobs([a, b], 1)
    store.put_blobs([a], 2)  # idempotent
    assert store.get_blob(a[0]) == b"alpha"
    assert store.get_blob(b[0]) == b""
    assert store.get_blob(hashlib.sha256(b"missing").digest()) is None
    missing = hashlib.sha256(b"missing").digest()
    assert store.has_blobs([a[0], b[0], missing]) == {a[0], b[0]}
    many = [blob(str(i).encode()) for i in range(1200)]  # more ids than one IN (...) chunk
    store.put_blobs(many, 3)
    assert store.has_blobs([i for i, _ in many] + [missing]) == {i for i, _ in many}


def test_bad_blob_hash_writes_nothing(store: SQLiteStore) -> None:
    good = blob(b"good")
    with pytest.raises(ValueError):
        store.put_blobs([good, (hashlib.sha256(b"x").digest(), b"y")], 1)
    with pytest.raises(ValueError):
        store.put_blobs([(b"short", b"short")], 1)
    assert store.has_blobs([good[0]]) == set()


def test_blob_edges(store: SQLiteStore) -> None:
    parent, child1, child2 = blob(b"parent"), blob(b"c1"), blob(b"c2")
    edges = [BlobEdge(parent[0], child1[0], "files", 0), BlobEdge(parent[0], child2[0], "files", 1)]
    store.put_blobs([parent, child1, child2], 1, edges)
    store.put_blobs([], 2, edges)  # idempotent
    assert store._conn is not None
    rows = store._conn.execute("SELECT child_id FROM blob_edges ORDER BY ordinal").fetchall()
    assert [r[0] for r in rows] == [child1[0], child2[0]]


def test_edge_to_unstored_blob_is_refused_atomically(store: SQLiteStore) -> None:
    parent, ghost = blob(b"parent"), blob(b"never sent")
    with pytest.raises(StoreError, match="not stored"):
        store.put_blobs([parent], 1, [BlobEdge(parent[0], ghost[0], "files", 0)])
    assert store.has_blobs([parent[0]]) == set()
