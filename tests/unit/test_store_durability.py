"""Durability per transaction: the run's runtime message commits at ``synchronous=NORMAL``, every
other write at FULL (the connection's setting, restored after each relaxed commit whatever
happened). SQLite reads the setting when COMMIT syncs, so the statements a connection executes
show which level each commit ran at."""

from __future__ import annotations

from pathlib import Path

import pytest

from byok.cursor.request import RunStart, parse_run_request
from byok.devtools.cursor_sim import user_turn
from byok.model.messages import Message
from byok.run import start_point
from byok.store import AsyncStore, SQLiteStore, StaleRevision

FULL, NORMAL = 2, 1


def traced(store: SQLiteStore) -> list[str]:
    statements: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(statements.append)
    return statements


def levels_at_commit(statements: list[str]) -> list[int]:
    """The synchronous level in force at each write transaction's COMMIT (reads commit too)."""
    level, writing, out = FULL, False, []
    for s in statements:
        if s == "PRAGMA synchronous=NORMAL":
            level = NORMAL
        elif s == "PRAGMA synchronous=FULL":
            level = FULL
        elif s.startswith("BEGIN"):
            writing = s == "BEGIN IMMEDIATE"
        elif s == "COMMIT" and writing:
            out.append(level)
    return out


def user(text: str) -> Message:
    return Message(role="user", origin="user", text=text)


def turn(request_id: str, text: str) -> RunStart:
    return parse_run_request(request_id, user_turn(text, conversation_id="c", model_id="m", message_id="m1"))


def test_a_relaxed_append_commits_at_normal_and_leaves_the_connection_at_full(tmp_path: Path) -> None:
    with SQLiteStore.open_in(tmp_path) as store:
        seen = traced(store)
        head = store.append("c", 0, [user("one")], 1)
        head = store.append("c", head.version, [user("two")], 2, durable=False)
        store.append("c", head.version, [user("three")], 3)
        assert levels_at_commit(seen) == [FULL, NORMAL, FULL]
        assert store.synchronous == FULL


def test_a_failed_relaxed_write_still_restores_full(tmp_path: Path) -> None:
    with SQLiteStore.open_in(tmp_path) as store:
        store.append("c", 0, [user("one")], 1)
        with pytest.raises(StaleRevision):
            store.append("c", 0, [user("stale")], 2, durable=False)
        assert store.synchronous == FULL
        seen = traced(store)
        store.move_head("c", 1, None, 3)
        assert levels_at_commit(seen) == [FULL]


@pytest.mark.parametrize("edit", [False, True])
async def test_the_start_of_a_user_turn_is_the_one_relaxed_trip(tmp_path: Path, edit: bool) -> None:
    """Its run row, an edit's branch and the runtime message commit at NORMAL; the turn's next
    commit (what a checkpoint will name) at FULL."""
    sync = SQLiteStore.open_in(tmp_path)
    store = AsyncStore(sync)
    if edit:  # m1 was sent before: sending it again branches from before it
        begun = await start_point.begin(store, turn("req-0", "hi"), user("hi"), 1)
        answer = Message(role="assistant", origin="assistant", text="a")
        await store.append("c", begun.head.version, [answer], 2)
    seen = traced(sync)
    runtime = user("hi again")
    begun = await start_point.begin(store, turn("req-1", "hi again"), runtime, 3)
    assert begun.appended and begun.head.messages[-1] == runtime
    assert len(begun.head.messages) == 1  # an edit branched from the empty history before m1
    writes = levels_at_commit(seen)
    assert writes == ([NORMAL, NORMAL] if edit else [NORMAL])
    answer = Message(role="assistant", origin="assistant", text="done")
    await store.append("c", begun.head.version, [answer], 4)
    assert levels_at_commit(seen) == [*writes, FULL]
    assert sync.synchronous == FULL
    await store.aclose()
