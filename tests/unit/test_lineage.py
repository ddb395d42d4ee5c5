"""Revision lineage: the turn list a revision's chain recorded nearest to it, the ancestor holding
a given number of messages, and walks that stop there however long the chain is."""

from __future__ import annotations

from pathlib import Path

import pytest

from byok.model.messages import Message
from byok.store import SQLiteStore
from byok.store.errors import StoreError
from tests.support.vm_steps import vm_steps


def user(text: str) -> Message:
    return Message(role="user", origin="user", text=text)


def turn(n: int) -> tuple[bytes, ...]:
    return (bytes([n]) * 32,)


def grow(store: SQLiteStore, conversation: str, appends: int, per_append: int = 1) -> list[int]:
    """``appends`` revisions on the conversation's head; their ids, oldest first."""
    head = store.head(conversation)
    ids = []
    for i in range(appends):
        batch = [user(f"{conversation} {i} {k}") for k in range(per_append)]
        head = store.append(conversation, head.version, batch, 1)
        assert head.revision_id is not None
        ids.append(head.revision_id)
    return ids


def test_the_nearest_recorded_turn_list_on_the_chain(tmp_path: Path) -> None:
    with SQLiteStore.open_in(tmp_path) as store:
        r = grow(store, "c", 6)
        store.save_turns("c", r[1], turn(1))
        store.save_turns("c", r[3], turn(2))
        assert store.turns_at(r[5]) == turn(2)
        assert store.turns_at(r[3]) == turn(2)
        assert store.turns_at(r[2]) == turn(1)
        assert store.turns_at(r[0]) == ()
        assert store.turns_at(None) == ()
        # A branch from r[2] does not see what r[3] recorded on the other branch.
        head = store.head("c")
        store.move_head("c", head.version, r[2], 1)
        (branch,) = grow(store, "c", 1)
        assert store.turns_at(branch) == turn(1)
        # An empty list recorded nearer hides an older one, as any recorded list does.
        store.save_turns("c", branch, ())
        (after,) = grow(store, "c", 1)
        assert store.turns_at(after) == ()


def test_the_ancestor_with_a_count(tmp_path: Path) -> None:
    with SQLiteStore.open_in(tmp_path) as store:
        r = grow(store, "c", 5, per_append=2)  # 2, 4, 6, 8, 10 messages
        assert [store.ancestor_with_count(r[4], n) for n in (10, 6, 2)] == [r[4], r[2], r[0]]
        assert store.ancestor_with_count(r[4], 0) is None
        for missing in (5, 1, 12):  # between two revisions, below the first, above the head
            with pytest.raises(StoreError, match=f"no ancestor of revision {r[4]} has {missing} messages"):
                store.ancestor_with_count(r[4], missing)
        head = store.head("c")
        store.move_head("c", head.version, r[1], 1)
        (branch,) = grow(store, "c", 1)  # 5 messages, on r[1]
        assert store.ancestor_with_count(branch, 5) == branch
        assert store.ancestor_with_count(branch, 4) == r[1]
        with pytest.raises(StoreError):
            store.ancestor_with_count(branch, 6)  # r[2] is on the other branch


def test_the_walks_stop_at_what_they_look_for(tmp_path: Path) -> None:
    with SQLiteStore.open_in(tmp_path) as store:
        conn = store._conn
        assert conn is not None
        steps = {}
        for name, length in (("short", 10), ("long", 2000)):
            r = grow(store, name, length)
            store.save_turns(name, r[-3], turn(7))
            steps[name] = (
                vm_steps(conn, lambda r=r: store.turns_at(r[-1])),  # type: ignore[misc]
                vm_steps(conn, lambda r=r: store.ancestor_with_count(r[-1], len(r) - 3)),  # type: ignore[misc]
            )
            assert store.turns_at(r[-1]) == turn(7)
            assert store.ancestor_with_count(r[-1], len(r) - 3) == r[-4]
        assert steps["long"] == steps["short"]
