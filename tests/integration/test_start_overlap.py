"""A user turn's first request is prepared while SQLite commits the runtime message.

The run's first store trip writes the runtime message, then COMMITs it (an fsync). The run
builds its provider request and opens the call meanwhile: the request's headers may reach the
provider during the commit, its body only after (clarification 4: the message is committed before
the provider call). A COMMIT that fails ends the run before any provider sees the message.

The store's worker is held inside the transaction, before COMMIT, by a threading gate the test
opens: the order is forced, not timed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from byok.devtools.cursor_sim import Transcript, user_turn
from byok.run import start_point
from byok.store import SQLiteStore
from byok.store.records import Head
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script
from tests.support.run_driver import cancel_message

HeadHook = Callable[[Head], None]


@pytest.fixture
def held_commit(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[HeadHook]]:
    """Each append that reports its head before COMMIT runs the hooks the test puts here after
    reporting it (on the store's worker, inside the transaction)."""
    hooks: list[HeadHook] = []
    original = SQLiteStore.append

    def append(self: SQLiteStore, *args: Any, before_commit: HeadHook | None = None, **kwargs: Any) -> Head:
        if before_commit is None:
            return original(self, *args, **kwargs)

        def reported(head: Head) -> None:
            before_commit(head)
            for hook in hooks:
                hook(head)

        return original(self, *args, before_commit=reported, **kwargs)

    monkeypatch.setattr(SQLiteStore, "append", append)
    yield hooks


def _committed_messages(daemon: Daemon) -> int:
    """Messages in the database as another connection sees them (committed ones only)."""
    path = next(daemon.data_dir.glob("*.sqlite3"))
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
    finally:
        conn.close()


async def _turn(daemon: Daemon, rid: str, out: list[Transcript], conversation: str = "") -> None:
    conversation = conversation or f"c-{rid}"
    request = user_turn("hello", conversation_id=conversation, model_id="byok-demo", message_id="m1")
    out.append(await daemon.sim.run(rid, request))


async def test_the_request_headers_go_out_during_the_commit_and_the_body_after_it(
    daemon: Daemon, held_commit: list[HeadHook]
) -> None:
    release = threading.Event()
    held_commit.append(lambda _head: release.wait(10) or None)
    headers = trio.Event()
    daemon.provider.on_head = headers.set
    daemon.provider.enqueue(chat_text_script(["hi there"]))
    out: list[Transcript] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_turn, daemon, "overlap", out)
        with trio.fail_after(10):
            await headers.wait()
        # The provider has the request's headers while the runtime message is uncommitted,
        # and no body: it cannot act on a message that is not durable yet.
        assert _committed_messages(daemon) == 0
        assert daemon.provider.requests == []
        release.set()
    (tr,) = out
    assert tr.end_stream == {} and tr.text() == "hi there"
    (request,) = daemon.provider.requests
    assert [m["role"] for m in request.json["messages"]] == ["system", "user"]
    assert _committed_messages(daemon) == 2  # the runtime message, then the answer


async def test_a_commit_that_fails_ends_the_run_before_the_provider_has_the_body(
    daemon: Daemon, held_commit: list[HeadHook]
) -> None:
    def fail(_head: Head) -> None:
        held_commit.clear()  # once
        raise sqlite3.OperationalError("disk I/O error (injected)")

    held_commit.append(fail)
    daemon.provider.enqueue(chat_text_script(["the answer"]))  # played to the first complete request
    out: list[Transcript] = []
    with trio.fail_after(10):
        await _turn(daemon, "fails", out)
    (tr,) = out
    assert tr.error is not None and tr.error["code"] == "internal", tr.end_stream
    assert "database failed" in tr.error["message"] and "disk I/O error" in tr.error["message"]
    assert daemon.provider.requests == []
    assert _committed_messages(daemon) == 0
    # The client sends the message again (a new request): it is committed once, and the
    # provider sees it once.
    with trio.fail_after(10):
        await _turn(daemon, "again", out, conversation="c-fails")
    assert out[1].end_stream == {} and out[1].text() == "the answer"
    (request,) = daemon.provider.requests
    assert [m["role"] for m in request.json["messages"]] == ["system", "user"]


async def test_a_cancel_while_the_start_trip_runs_still_records_the_runs_end(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel lands while the store's worker is in the start trip, before the append: the
    trip still writes the run's row, and the run's end is recorded on it (not left running)."""
    release = threading.Event()
    reached = trio.Event()
    token = trio.lowlevel.current_trio_token()
    original = start_point._begin_user_turn

    def held(*args: Any, **kwargs: Any) -> Any:
        token.run_sync_soon(reached.set)
        release.wait(10)
        return original(*args, **kwargs)

    monkeypatch.setattr(start_point, "_begin_user_turn", held)
    daemon.provider.enqueue(chat_text_script(["never shown"]))
    out: list[Transcript] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_turn, daemon, "cancel", out)
        with trio.fail_after(10):
            await reached.wait()
            response = await daemon.sim.append("cancel", 1, cancel_message())
        assert response.status_code == 200
        release.set()
    (tr,) = out
    assert tr.error is not None and tr.error["code"] == "canceled", tr.end_stream
    assert daemon.provider.requests == []
    with trio.fail_after(10):
        while (run := await trio.to_thread.run_sync(_run_status, daemon, "cancel")) == "running":
            await trio.sleep(0.01)
    assert run == "canceled"


def _run_status(daemon: Daemon, rid: str) -> str | None:
    with SQLiteStore.open_in(daemon.data_dir) as store:
        run = store.run(rid)
    return None if run is None else run.status
