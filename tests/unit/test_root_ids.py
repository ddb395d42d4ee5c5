"""Saved checkpoint root ids: the store's table (store/root_ids.py) and how a conversation's
memory uses them (run/conversation.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from byok.cursor import checkpoint
from byok.model.messages import Message
from byok.run import conversation
from byok.run.conversation import RECALL_MIN, ConversationMemory
from byok.store import SQLiteStore, schema


def msgs(n: int, tag: str = "m") -> list[Message]:
    return [Message(role="user", origin="user", text=f"{tag}{i}") for i in range(n)]


def fake_id(i: int) -> bytes:
    return bytes([i % 256]) * 32


# --- store --------------------------------------------------------------------------------------


def test_saved_ids_come_back_for_the_history_of_a_revision_only(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "db.sqlite3") as store:
        base = store.append("c", 0, msgs(3), 1)
        trunk = store.append("c", base.version, msgs(2, "t"), 2)
        branch_parent = store.ancestor_with_count(trunk.revision_id, 3)
        moved = store.move_head("c", trunk.version, branch_parent, 3)
        branch = store.append("c", moved.version, msgs(1, "b"), 4)
        store.start_run("r", "c", "model", 5)
        every = [*trunk.messages, *branch.messages[3:]]
        store.finish_run("r", "success", 6, root_ids=[(m.id, fake_id(i)) for i, m in enumerate(every)])

        on_branch = store.root_ids_at(branch.revision_id)
        assert on_branch == {m.id: fake_id(every.index(m)) for m in branch.messages}
        assert len(store.root_ids_at(trunk.revision_id)) == 5
        assert store.root_ids_at(None) == {}


def test_a_later_id_replaces_an_earlier_one(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "db.sqlite3") as store:
        head = store.append("c", 0, msgs(1), 1)
        (m,) = head.messages
        for i, rid in enumerate([fake_id(1), fake_id(2)]):
            store.start_run(f"r{i}", "c", "model", 2)
            store.finish_run(f"r{i}", "success", 3, root_ids=[(m.id, rid)])
        assert store.root_ids_at(head.revision_id) == {m.id: fake_id(2)}


def test_a_failed_terminal_write_saves_no_ids(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "db.sqlite3") as store:
        head = store.append("c", 0, msgs(1), 1)
        store.start_run("r", "c", "model", 2)
        store.finish_run("r", "success", 3)
        with pytest.raises(Exception, match="already"):
            store.finish_run("r", "error", 4, root_ids=[(head.messages[0].id, fake_id(1))])
        assert store.root_ids_at(head.revision_id) == {}


def test_a_version_4_database_gains_the_table_and_keeps_its_history(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with SQLiteStore(path) as store:
        head = store.append("c", 0, msgs(2), 1)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TABLE message_roots")
    conn.execute("DROP TABLE console_entries")  # schema 9
    conn.execute("DROP INDEX llm_calls_by_time")
    for column in ("model_id", "alias_id"):
        conn.execute(f"ALTER TABLE llm_calls DROP COLUMN {column}")
    conn.execute("DROP TABLE rendered_prefixes")  # schema 7
    for column in ("compared_bytes", "compared_messages", "compared_sha256"):  # schema 6
        conn.execute(f"ALTER TABLE llm_calls DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 4")
    conn.close()
    with SQLiteStore(path) as store:
        assert store.head("c").messages == head.messages
        assert store.root_ids_at(head.revision_id) == {}
        store.start_run("r", "c", "model", 2)
        store.finish_run("r", "success", 3, root_ids=[(head.messages[0].id, fake_id(7))])
        assert store.root_ids_at(head.revision_id) == {head.messages[0].id: fake_id(7)}
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 9


# --- memory -------------------------------------------------------------------------------------


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[Message]:
    seen: list[Message] = []

    def counting(message: Message) -> checkpoint.Blob:
        seen.append(message)
        return checkpoint.root_blob(message)

    monkeypatch.setattr(conversation, "root_blob", counting)
    return seen


def test_new_roots_are_unsaved_until_the_store_has_them(encoded: list[Message]) -> None:
    memory = ConversationMemory()
    a, b = msgs(2)
    pairs = [(m.id, memory.root_of(m).id) for m in (a, b)]
    assert memory.unsaved == dict(pairs) and len(encoded) == 2
    memory.saved(pairs[:1])
    assert memory.unsaved == dict(pairs[1:])


def test_a_recalled_id_the_client_holds_is_listed_without_encoding(encoded: list[Message]) -> None:
    memory = ConversationMemory()
    (m,) = msgs(1)
    older = fake_id(9)  # what an older encoding published: the client holds that blob
    memory.recall({m.id: older})
    memory.acked.add(older)
    assert memory.root_of(m).id == older and memory.root_id_of(m) == older
    assert encoded == [] and memory.unsaved == {}


def test_a_recalled_id_the_client_lacks_is_encoded_again_and_replaced(encoded: list[Message]) -> None:
    memory = ConversationMemory()
    (m,) = msgs(1)
    memory.recall({m.id: fake_id(9)})
    blob = memory.root_of(m, with_data=True)
    assert blob == checkpoint.root_blob(m) and encoded == [m]
    assert memory.unsaved == {m.id: blob.id}  # saved again, over the stale one
    assert memory.root_id_of(m) == blob.id


def test_recall_keeps_what_this_daemon_worked_out(encoded: list[Message]) -> None:
    memory = ConversationMemory()
    (m,) = msgs(1)
    own = memory.root_of(m).id
    memory.recall({m.id: fake_id(3)})
    assert memory.root_id_of(m) == own and memory.recalled


def test_recall_is_worth_a_trip_once_and_only_for_long_histories() -> None:
    memory = ConversationMemory()
    assert not memory.needs_recall(msgs(RECALL_MIN - 1))
    history = msgs(RECALL_MIN)
    assert memory.needs_recall(history)
    for m in history[: RECALL_MIN // 2]:
        memory.root_of(m)
    assert not memory.needs_recall(history)  # most ids known: encoding the rest is cheaper
    memory.recall({})
    assert not memory.needs_recall(msgs(3 * RECALL_MIN, "x"))  # once per daemon life
