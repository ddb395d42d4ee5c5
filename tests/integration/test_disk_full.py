"""A database that cannot be written (disk full, read-only): the run ends with an error that
says so, nothing half-written stays, and the daemon serves the next turn once the disk is back."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import trio

from byok.devtools.cursor_sim import user_turn
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script
from tests.support.store_faults import NO_PAGE_LIMIT, before_each_write


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``disk["state"]``: "ok"; "full", the database file cannot grow (its max_page_count pinned
    at its size: SQLITE_FULL, "database or disk is full"); or "read-only", no write at all
    (SQLITE_READONLY). Applied to every write transaction of the daemon's store."""
    disk = {"state": "ok"}

    def refuse(conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA query_only = {int(disk['state'] == 'read-only')}")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages if disk['state'] == 'full' else NO_PAGE_LIMIT}")

    before_each_write(monkeypatch, refuse)
    return disk


def turn(text: str, msg: str) -> Any:
    return user_turn(text, conversation_id="conv-disk", model_id="byok-demo", message_id=msg)


@pytest.mark.parametrize(
    ("state", "reason"),
    [("full", "database or disk is full"), ("read-only", "attempt to write a readonly database")],
)
async def test_a_database_that_cannot_be_written_fails_the_run_not_the_daemon(
    daemon: Daemon, disk: dict[str, str], state: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    daemon.provider.enqueue(chat_text_script(["first answer"]))
    assert (await daemon.sim.run("req-1", turn("hello", "m1"))).end_stream == {}

    disk["state"] = state
    with trio.fail_after(10):
        failed = await daemon.sim.run("req-2", turn("y" * 2_000_000, "m2"))  # needs new pages
    assert failed.error is not None and failed.error["code"] == "internal"
    assert failed.error["message"] == f"byok's database failed: sqlite: {reason}"
    assert "interaction_update.turn_ended" not in failed.kinds()
    assert len(daemon.provider.requests) == 1  # the message was not committed: no call

    # The client has the end before the daemon records it: the disk comes back only once the
    # daemon has tried, or it would take the record.
    with trio.fail_after(10), SQLiteStore.open_in(daemon.data_dir) as store:
        while not (
            any("its end (error) could not be recorded" in r.getMessage() for r in caplog.records)
            if state == "read-only"
            else store.run("req-2") is not None
        ):
            await trio.sleep(0.01)
    disk["state"] = "ok"
    daemon.provider.enqueue(chat_text_script(["second answer"]))
    with trio.fail_after(10):  # the user sends the same message again
        again = await daemon.sim.run("req-3", turn("y" * 2_000_000, "m2"))
    assert again.end_stream == {}, again.end_stream
    sent = daemon.provider.requests[-1].json["messages"]
    assert [m["role"] for m in sent[1:]] == ["user", "assistant", "user"]
    assert sum("y" * 1000 in str(m["content"]) for m in sent) == 1  # once, not once per attempt
    with SQLiteStore.open_in(daemon.data_dir) as store:
        roles = [m.role for m in store.head("conv-disk").messages]
        assert roles == ["user", "assistant", "user", "assistant"]
        run = store.run("req-2")
        # Its end was recorded where only the big message could not fit; a read-only database
        # took nothing, not even the run's row (a row left 'running' is marked interrupted at the
        # next start).
        assert (run is not None and run.status == "error") if state == "full" else run is None
