"""SQLiteStore: the synchronous store, source of truth for conversation history.

History model: a conversation points at a head revision; each revision appends messages to its
parent; a revision never changes once committed. Editing a message is "move the head back to where
that input was anchored, then append", so old branches stay readable. Every write is one
``BEGIN IMMEDIATE`` transaction guarded by a compare-and-swap on ``conversations.version``.

Durability: the connection runs ``synchronous=FULL`` (the WAL is fsynced at every commit). A write
passed ``durable=False`` commits at ``synchronous=NORMAL``: its frames are written to the WAL (a
kill -9 of byok cannot lose them) but not fsynced, so only an OS crash or a power loss can. It is
for the run's runtime message before the provider call, of which the client has seen nothing yet.
The next FULL commit fsyncs the WAL file, and with it every frame before its own: whatever a
checkpoint, a tool result or ``turn_ended`` depends on is on disk before the client hears of it.

Not thread-safe by itself: AsyncStore serializes all calls through one worker at a time.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from byok.model.messages import Message
from byok.model.usage import Usage
from byok.store import blobs as _blobs
from byok.store import lineage, revisions, schema
from byok.store import rendered_prefixes as _rendered
from byok.store import root_ids as _root_ids
from byok.store import runs as _runs
from byok.store.errors import StoreError
from byok.store.history_cache import DEFAULT_CACHE_BYTES, HistoryCache
from byok.store.images import load_images, save_images
from byok.store.records import BlobEdge, ComparedPrefix, Head, LlmCallRecord, RunRecord, RunStatus
from byok.store.rendered_prefixes import StoredRender

log = logging.getLogger("byok.store")

DB_FILENAME = "byok.sqlite3"
T = TypeVar("T")


class SQLiteStore:
    def __init__(self, path: Path, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = schema.connect(path)
        self._cache = HistoryCache(cache_bytes)

    @classmethod
    def open_in(cls, data_dir: Path, *, cache_bytes: int | None = None) -> SQLiteStore:
        """Open ``<data_dir>/byok.sqlite3``, creating a private data dir if it does not exist."""
        if not data_dir.exists():
            data_dir.mkdir(mode=0o700, parents=True)
            data_dir.chmod(0o700)  # mkdir's mode is filtered by the umask
        return cls(data_dir / DB_FILENAME, cache_bytes=cache_bytes or DEFAULT_CACHE_BYTES)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        self.forget_cached()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transactions ---------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction; sqlite errors surface as StoreError, any exception rolls back.
        ``durable=False``: a write committed at ``synchronous=NORMAL`` (module docstring).

        Reads use a deferred BEGIN too, so a multi-statement read sees one snapshot even when another
        process writes the same file.
        """
        conn = self._conn
        if conn is None:
            raise StoreError("store is closed")
        relaxed = write and not durable
        try:
            if relaxed:  # outside the transaction: the setting is read when COMMIT syncs
                conn.execute("PRAGMA synchronous=NORMAL")
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    # Some errors (disk full, I/O) already rolled back; a second ROLLBACK would raise.
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            finally:
                if relaxed:
                    conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as e:
            raise StoreError(f"sqlite: {e}") from e

    @property
    def synchronous(self) -> int:
        """The connection's ``PRAGMA synchronous`` between transactions (2: FULL)."""
        if self._conn is None:
            raise StoreError("store is closed")
        return int(self._conn.execute("PRAGMA synchronous").fetchone()[0])

    # -- conversations --------------------------------------------------------------------------

    def head(self, conversation_id: str) -> Head:
        with self._transaction(write=False) as conn:
            head = self._head(conn, conversation_id)
        self._cache.remember(head)
        return head

    def messages_at(self, revision_id: int) -> tuple[Message, ...]:
        with self._transaction(write=False) as conn:
            messages = self._messages(conn, revision_id)
        self._cache.remember_revision(revision_id, messages, None)
        return messages

    def forget_cached(self) -> None:
        """Drop every decoded history (the next read decodes from SQLite again), and SQLite's own
        page cache (up to 2 MiB; a stored render passes through it)."""
        self._cache.clear()
        if self._conn is not None:
            self._conn.execute("PRAGMA shrink_memory")

    def forget_conversation(self, conversation_id: str) -> None:
        """Drop ``conversation_id``'s decoded history (the cache budget evicted it)."""
        self._cache.forget(conversation_id)

    @property
    def cached_bytes(self) -> int:
        return self._cache.size

    def cached_bytes_of(self, conversation_id: str) -> int:
        """Bytes of ``conversation_id``'s decoded history in the cache. Two dict reads: safe
        from the event loop's thread while the worker runs (at worst one commit stale)."""
        return self._cache.size_of(conversation_id)

    def append(
        self,
        conversation_id: str,
        expected_version: int,
        messages: Sequence[Message],
        now_ms: int,
        *,
        event_id: str | None = None,
        input_id: str | None = None,
        start_run: tuple[str, str] | None = None,
        rebase: bool = False,
        durable: bool = True,
    ) -> Head:
        """Append ``messages`` as a new head revision, if the conversation is still at
        ``expected_version`` (0 = does not exist yet). Raises StaleRevision otherwise.
        ``start_run``: (request_id, model_id) of a run whose row is written in the same transaction.
        ``durable=False``: committed at ``synchronous=NORMAL`` (module docstring).

        ``event_id``: exactly-once key of the runtime event these messages consume; if it was already
        consumed nothing is appended and the current head is returned (whatever its version), so a
        retry replays instead of appending twice. ``input_id``: the first time it is seen, the head
        before this append is recorded as the point an edit of that input branches from.
        ``rebase``: the messages start a new history (a compaction's summary): the new revision
        is a root, and the head's old revisions stay as they are.
        """
        if not messages:
            raise ValueError("append needs at least one message")
        encoded = [message.encode() for message in messages]
        ids = [message.id for message in messages]  # SHA-256 of encoded, memoised on the message
        with self._transaction(write=True, durable=durable) as conn:
            if start_run is not None:
                _runs.start_run(conn, start_run[0], conversation_id, start_run[1], now_ms)
            if event_id is not None and revisions.event_seen(conn, conversation_id, event_id):
                head = self._head(conn, conversation_id)
            else:
                parent = revisions.claim(conn, conversation_id, expected_version, now_ms)
                if rebase:
                    parent = None
                parent_count = revisions.message_count(conn, parent)
                if any(m.attachments for m in messages):
                    save_images(conn, messages, now_ms)
                conn.executemany(
                    "INSERT OR IGNORE INTO messages (id, data) VALUES (?, ?)", zip(ids, encoded, strict=True)
                )
                cur = conn.execute(
                    "INSERT INTO revisions (conversation_id, parent_id, message_count, created_at_ms)"
                    " VALUES (?, ?, ?, ?)",
                    (conversation_id, parent, parent_count + len(ids), now_ms),
                )
                revision_id = cur.lastrowid
                assert revision_id is not None
                conn.executemany(
                    "INSERT INTO revision_messages (revision_id, ordinal, message_id) VALUES (?, ?, ?)",
                    [(revision_id, parent_count + i, mid) for i, mid in enumerate(ids)],
                )
                revisions.set_head(conn, conversation_id, revision_id, now_ms)
                if event_id is not None:
                    conn.execute(
                        "INSERT INTO runtime_events"
                        " (conversation_id, event_id, message_id, revision_id, created_at_ms)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (conversation_id, event_id, ids[0], revision_id, now_ms),
                    )
                if input_id is not None:
                    conn.execute(
                        "INSERT OR IGNORE INTO input_anchors"
                        " (conversation_id, input_id, revision_id, created_at_ms) VALUES (?, ?, ?, ?)",
                        (conversation_id, input_id, parent, now_ms),
                    )
                # The result must equal a reload: keep the caller's message (its encodings stay
                # memoised) when decoding what was stored gives it back field for field, which
                # decodes_to_itself guarantees; decode it otherwise.
                before = self._messages(conn, parent)
                added = tuple(
                    m if m.decodes_to_itself() else Message.decode(data)
                    for m, data in zip(messages, encoded, strict=True)
                )
                load_images(conn, [m for m in added if any(not p.data for p in m.attachments)])
                after = before + added
                head = Head(conversation_id, revision_id, expected_version + 1, after)
        self._cache.remember(head)
        return head

    def move_head(
        self,
        conversation_id: str,
        expected_version: int,
        revision_id: int | None,
        now_ms: int,
        *,
        durable: bool = True,
    ) -> Head:
        """Point the conversation at ``revision_id`` (one of its own revisions, or None for empty).
        Compare-and-swap like append; the revisions left behind stay readable."""
        with self._transaction(write=True, durable=durable) as conn:
            if revision_id is not None:
                row = conn.execute(
                    "SELECT conversation_id FROM revisions WHERE id = ?", (revision_id,)
                ).fetchone()
                if row is None or row[0] != conversation_id:
                    raise StoreError(
                        f"revision {revision_id} does not belong to conversation {conversation_id!r}"
                    )
            revisions.claim(conn, conversation_id, expected_version, now_ms)
            revisions.set_head(conn, conversation_id, revision_id, now_ms)
            head = Head(conversation_id, revision_id, expected_version + 1, self._messages(conn, revision_id))
        self._cache.remember(head)
        return head

    def ancestor_with_count(self, revision_id: int | None, count: int) -> int | None:
        """The revision on ``revision_id``'s chain holding exactly ``count`` messages (resume points)."""
        with self._transaction(write=False) as conn:
            try:
                return lineage.ancestor_with_count(conn, revision_id, count)
            except LookupError as e:
                raise StoreError(str(e)) from None

    def revisions_with_count(self, conversation_id: str, count: int) -> list[tuple[int, Message]]:
        """The revisions of any branch holding exactly ``count`` messages, each with its last
        message, newest first (a resume from a point the head has left)."""
        with self._transaction(write=False) as conn:
            rows = lineage.revisions_with_count(conn, conversation_id, count)
        return [(revision_id, Message.stored(mid, data)) for revision_id, mid, data in rows]

    def turns_at(self, revision_id: int | None) -> tuple[bytes, ...]:
        with self._transaction(write=False) as conn:
            return lineage.turns_at(conn, revision_id)

    def save_turns(self, conversation_id: str, revision_id: int | None, turns: tuple[bytes, ...]) -> None:
        if revision_id is None:
            raise StoreError(f"conversation {conversation_id!r} has no revision to record turns at")
        with self._transaction(write=True) as conn:
            lineage.save_turns(conn, revision_id, turns)

    def interrupt_running_runs(self, now_ms: int) -> int:
        with self._transaction(write=True) as conn:
            return lineage.interrupt_running_runs(conn, now_ms)

    def runtime_event_message(self, conversation_id: str, event_id: str) -> Message | None:
        with self._transaction(write=False) as conn:
            row = conn.execute(
                "SELECT m.data FROM runtime_events AS e JOIN messages AS m ON m.id = e.message_id"
                " WHERE e.conversation_id = ? AND e.event_id = ?",
                (conversation_id, event_id),
            ).fetchone()
        return None if row is None else Message.decode(row[0])

    def input_anchor(self, conversation_id: str, input_id: str) -> tuple[bool, int | None]:
        """(found, revision the input was appended onto; None = the empty conversation)."""
        with self._transaction(write=False) as conn:
            row = conn.execute(
                "SELECT revision_id FROM input_anchors WHERE conversation_id = ? AND input_id = ?",
                (conversation_id, input_id),
            ).fetchone()
        return (False, None) if row is None else (True, row[0])

    def _head(self, conn: sqlite3.Connection, conversation_id: str) -> Head:
        row = revisions.head_row(conn, conversation_id)
        if row is None:
            return Head(conversation_id, None, 0, ())
        revision_id, version = row
        return Head(conversation_id, revision_id, version, self._messages(conn, revision_id))

    def _messages(self, conn: sqlite3.Connection, revision_id: int | None) -> tuple[Message, ...]:
        if revision_id is None:
            return ()
        cached = self._cache.get(revision_id)
        return cached if cached is not None else revisions.read_history(conn, revision_id)

    # -- runs and provider calls ----------------------------------------------------------------

    def start_run(
        self, request_id: str, conversation_id: str, model_id: str, now_ms: int, *, durable: bool = True
    ) -> None:
        with self._transaction(write=True, durable=durable) as conn:
            _runs.start_run(conn, request_id, conversation_id, model_id, now_ms)

    def finish_run(
        self,
        request_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        error_code: str | None = None,
        error_message: str | None = None,
        usage: Usage | None = None,
        root_ids: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Write the run's terminal state (a run ends once: a second finish raises StoreError),
        with the ``(message id, root id)`` pairs its checkpoints worked out (store/root_ids.py)."""
        with self._transaction(write=True) as conn:
            _root_ids.save(conn, root_ids)
            _runs.finish_run(conn, request_id, status, now_ms, error_code, error_message, usage)

    def root_ids_at(self, revision_id: int | None) -> dict[bytes, bytes]:
        """Saved root ids of the history at ``revision_id``, by message id."""
        with self._transaction(write=False) as conn:
            return _root_ids.at_revision(conn, revision_id)

    def rendered_prefix(self, conversation_id: str, render_key: bytes) -> StoredRender | None:
        with self._transaction(write=False) as conn:
            return _rendered.load(conn, conversation_id, render_key)

    def save_rendered_prefix(
        self,
        conversation_id: str,
        render_key: bytes,
        message_count: int,
        messages_sha256: bytes,
        texts: Sequence[bytes],
    ) -> bool:
        """Keep ``texts`` as the render of the conversation's first ``message_count`` messages;
        False (nothing written) when the row already holds that render of those messages."""
        with self._transaction(write=True) as conn:
            if _rendered.saved(conn, conversation_id, render_key) == (message_count, messages_sha256):
                return False
            _rendered.save(conn, conversation_id, render_key, message_count, messages_sha256, texts)
            return True

    def wal_bytes(self) -> int:
        """The size of the WAL file: roughly what a checkpoint would copy (schema's
        WAL_SIZE_LIMIT_BYTES). A stat of the file, not a use of the connection: any thread."""
        try:
            return os.path.getsize(f"{self.path}-wal")
        except OSError:
            return 0

    def checkpoint_wal(self) -> None:
        """Copy committed WAL pages into the database file (PASSIVE: never waits for readers)."""
        if self._conn is None:
            raise StoreError("store is closed")
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as e:
            raise StoreError(f"sqlite: {e}") from e

    def run(self, request_id: str) -> RunRecord | None:
        with self._transaction(write=False) as conn:
            return _runs.run(conn, request_id)

    def record_llm_call(self, rec: LlmCallRecord) -> int:
        with self._transaction(write=True) as conn:
            return _runs.record_llm_call(conn, rec)

    def record_llm_calls(self, records: Sequence[LlmCallRecord]) -> list[int]:
        """Write ``records`` in one transaction (all or none); their ids, in order."""
        with self._transaction(write=True) as conn:
            return [_runs.record_llm_call(conn, rec) for rec in records]

    def llm_calls(self, request_id: str) -> list[LlmCallRecord]:
        with self._transaction(write=False) as conn:
            return _runs.llm_calls(conn, request_id)

    def last_llm_call(self, conversation_id: str) -> LlmCallRecord | None:
        """The conversation's most recently recorded provider call."""
        with self._transaction(write=False) as conn:
            return _runs.last_llm_call(conn, conversation_id)

    def last_llm_call_prefix(self, conversation_id: str) -> ComparedPrefix | None:
        """The row id and compared prefix of the conversation's last call, without its body."""
        with self._transaction(write=False) as conn:
            return _runs.last_llm_call_prefix(conn, conversation_id)

    def prefix_stats(self, conversation_id: str | None = None) -> tuple[int, int]:
        """(calls_compared, calls_extending) over one conversation, or all with None."""
        with self._transaction(write=False) as conn:
            return _runs.prefix_stats(conn, conversation_id)

    # -- anything else ---------------------------------------------------------------------------

    def transact(self, fn: Callable[..., T], *args: object, write: bool = False) -> T:
        """``fn(conn, *args)`` inside one transaction (the console's entries and queries)."""
        with self._transaction(write=write) as conn:
            return fn(conn, *args)

    # -- blobs ----------------------------------------------------------------------------------

    def put_blobs(
        self, blobs: Sequence[tuple[bytes, bytes]], now_ms: int, edges: Sequence[BlobEdge] = ()
    ) -> None:
        """Store (id, data) pairs and edges in one transaction; ValueError (nothing written) if an id
        is not the SHA-256 of its data, StoreError if an edge names a blob that is not stored."""
        _blobs.verify_blobs(blobs)
        with self._transaction(write=True) as conn:
            _blobs.put_blobs(conn, blobs, now_ms, edges)

    def get_blob(self, blob_id: bytes) -> bytes | None:
        with self._transaction(write=False) as conn:
            return _blobs.get_blob(conn, blob_id)

    def has_blobs(self, ids: Iterable[bytes]) -> set[bytes]:
        with self._transaction(write=False) as conn:
            return _blobs.has_blobs(conn, ids)
