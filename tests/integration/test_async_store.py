"""AsyncStore under trio on a real file: serialized concurrent writers, CAS, and crash safety."""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from byok.model.messages import Message
from byok.store import DB_FILENAME, AsyncStore, StaleRevision


def user(text: str) -> Message:
    return Message(role="user", origin="user", text=text)


async def test_open_creates_private_data_dir_and_persists(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with await AsyncStore.open(data_dir) as store:
        assert store.path == data_dir / DB_FILENAME
        head = await store.append("c", 0, [user("hi")], 1, event_id="e1", input_id="i1")
        await store.start_run("r1", "c", "m", 1)
        await store.finish_run("r1", "canceled", 2)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    async with await AsyncStore.open(data_dir) as store:
        assert await store.head("c") == head
        assert await store.runtime_event_message("c", "e1") == user("hi")
        assert await store.input_anchor("c", "i1") == (True, None)
        run = await store.run("r1")
        assert run is not None and run.status == "canceled"


async def test_concurrent_appends_on_one_version_let_exactly_one_win(tmp_path: Path) -> None:
    async with await AsyncStore.open(tmp_path) as store:
        start = await store.head("c")
        winners: list[int] = []
        stale: list[int] = []

        async def writer(i: int) -> None:
            try:
                await store.append("c", start.version, [user(f"from {i}")], i)
            except StaleRevision:
                stale.append(i)
            else:
                winners.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(writer, i)

        assert len(winners) == 1 and len(stale) == 7
        head = await store.head("c")
        assert (head.version, head.messages) == (1, (user(f"from {winners[0]}"),))


async def test_concurrent_writers_with_retry_serialize(tmp_path: Path) -> None:
    tasks, per_task = 6, 10
    async with await AsyncStore.open(tmp_path) as store:
        rejected = 0

        async def writer(i: int) -> None:
            nonlocal rejected
            for n in range(per_task):
                while True:
                    head = await store.head("c")
                    await trio.sleep(0)  # let other writers move the head in between
                    try:
                        await store.append("c", head.version, [user(f"{i}:{n}")], n)
                        break
                    except StaleRevision:
                        rejected += 1

        async with trio.open_nursery() as nursery:
            for i in range(tasks):
                nursery.start_soon(writer, i)

        head = await store.head("c")
        assert head.version == tasks * per_task
        texts = [m.text for m in head.messages]
        assert sorted(texts) == sorted(f"{i}:{n}" for i in range(tasks) for n in range(per_task))
        for i in range(tasks):  # each writer's messages stay in its own order
            assert [t for t in texts if t.startswith(f"{i}:")] == [f"{i}:{n}" for n in range(per_task)]
        assert rejected > 0  # the CAS really was exercised


async def test_two_stores_on_one_file_share_the_cas(tmp_path: Path) -> None:
    # Two connections stand in for two processes: BEGIN IMMEDIATE + busy_timeout serialize them.
    async with await AsyncStore.open(tmp_path) as a, await AsyncStore.open(tmp_path) as b:
        await a.append("c", 0, [user("a")], 1)
        with pytest.raises(StaleRevision):
            await b.append("c", 0, [user("b")], 2)
        head = await b.append("c", 1, [user("b")], 2)
        assert await a.head("c") == head


# Appends 3 large messages per revision as fast as it can and reports each committed version.
_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from byok.model.messages import Message
    from byok.store.sqlite_store import SQLiteStore

    store = SQLiteStore(Path(sys.argv[1]))
    version = store.head("k").version
    while True:
        batch = [
            Message(role="user", origin="user", text=f"{version}:{j}:" + "x" * 20000) for j in range(3)
        ]
        version = store.append("k", version, batch, version).version
        print(version, flush=True)
    """
)


async def _append_until_killed(db: Path, min_commits: int) -> int:
    """Run the child until it reports ``min_commits`` more commits, SIGKILL it, return the last one."""
    proc = await trio.lowlevel.open_process([sys.executable, "-c", _CHILD, str(db)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    buffer = b""
    reported: list[int] = []
    try:
        with trio.fail_after(60):
            while len(reported) < min_commits:
                chunk = await proc.stdout.receive_some()
                assert chunk, f"child exited early with {await proc.wait()}"
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                reported.extend(int(line) for line in lines)
    finally:
        proc.kill()  # SIGKILL: no atexit, no rollback, possibly mid-transaction
        await proc.wait()
        await proc.stdout.aclose()
    assert proc.returncode == -9
    return reported[-1]


def _check_no_partial_revision(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        rows = conn.execute(
            """
            SELECT r.id, r.message_count, coalesce(p.message_count, 0),
                   count(rm.ordinal), min(rm.ordinal), max(rm.ordinal)
            FROM revisions AS r
            LEFT JOIN revisions AS p ON p.id = r.parent_id
            LEFT JOIN revision_messages AS rm ON rm.revision_id = r.id
            GROUP BY r.id
            """
        ).fetchall()
        for rev, total, before, appended, lo, hi in rows:
            assert (appended, lo, hi) == (total - before, before, total - 1), f"revision {rev} is partial"
    finally:
        conn.close()


async def test_sigkilled_writer_loses_no_commit_and_leaves_no_partial_revision(tmp_path: Path) -> None:
    db = tmp_path / DB_FILENAME
    for _ in range(3):  # each round also proves a crashed file can be written again
        last_reported = await _append_until_killed(db, min_commits=15)
        _check_no_partial_revision(db)
        async with await AsyncStore.open(tmp_path) as store:
            head = await store.head("k")
        # The child may have committed once more after its last report, never less.
        assert head.version in (last_reported, last_reported + 1)
        assert len(head.messages) == 3 * head.version
        for v in range(head.version):
            for j in range(3):
                assert head.messages[3 * v + j].text.startswith(f"{v}:{j}:")


async def test_cancelled_caller_leaves_a_consistent_store(tmp_path: Path) -> None:
    async with await AsyncStore.open(tmp_path) as store:
        for attempt in range(20):
            head = await store.head("c")
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(store.append, "c", head.version, [user(f"m{attempt}")], attempt)
                    await trio.sleep(0)
                    scope.cancel()
            after = await store.head("c")
            # Either the whole append committed or none of it did; the store stays usable.
            assert after.version in (head.version, head.version + 1)
            assert len(after.messages) == after.version
