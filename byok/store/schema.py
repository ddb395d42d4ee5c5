"""Schema and connection setup for the SQLite store.

The schema is versioned with ``PRAGMA user_version``. ``MIGRATIONS[i]`` upgrades a database from
version ``i`` to ``i + 1``; version 0 is an empty file. Migrations run in place when a database is
opened (version 1 -> 2 adds the call-record columns with ALTER TABLE ADD COLUMN, keeping rows).
A database written by a newer byok is refused rather than guessed at, because an older daemon
could silently drop what it does not understand.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from byok.store import call_bodies, console_tables, lineage, rendered_prefixes, root_ids
from byok.store.errors import StoreError

SCHEMA_VERSION = 9

# Usage columns shared by runs and llm_calls; NULL input_tokens means "no usage reported".
USAGE_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
_USAGE_DDL = ",\n    ".join(f"{c} INTEGER" for c in USAGE_COLUMNS)

_V1: tuple[str, ...] = (
    # head_revision references a table declared below; SQLite resolves foreign keys lazily.
    """CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY NOT NULL,
    head_revision INTEGER REFERENCES revisions(id),
    version INTEGER NOT NULL CHECK (version >= 0),
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
)""",
    # Content-addressed: id = sha256(data), data = Message.encode(). Rows are never updated.
    """CREATE TABLE messages (
    id BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 32),
    data BLOB NOT NULL
)""",
    # AUTOINCREMENT so a revision id is never reused, even after the newest one is gone; the
    # in-process message cache relies on a committed id meaning one history forever.
    """CREATE TABLE revisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations(conversation_id),
    parent_id INTEGER REFERENCES revisions(id),
    message_count INTEGER NOT NULL CHECK (message_count >= 0),
    created_at_ms INTEGER NOT NULL
)""",
    "CREATE INDEX revisions_by_conversation ON revisions(conversation_id, id)",
    # The messages a revision appends to its parent; ordinal is the absolute position in the history.
    """CREATE TABLE revision_messages (
    revision_id INTEGER NOT NULL REFERENCES revisions(id),
    ordinal INTEGER NOT NULL CHECK (ordinal >= 0),
    message_id BLOB NOT NULL REFERENCES messages(id),
    PRIMARY KEY (revision_id, ordinal)
) WITHOUT ROWID""",
    # revision_id NULL = the input arrived before the conversation had any revision.
    """CREATE TABLE input_anchors (
    conversation_id TEXT NOT NULL REFERENCES conversations(conversation_id),
    input_id TEXT NOT NULL,
    revision_id INTEGER REFERENCES revisions(id),
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, input_id)
) WITHOUT ROWID""",
    """CREATE TABLE runtime_events (
    conversation_id TEXT NOT NULL REFERENCES conversations(conversation_id),
    event_id TEXT NOT NULL,
    message_id BLOB NOT NULL REFERENCES messages(id),
    revision_id INTEGER NOT NULL REFERENCES revisions(id),
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, event_id)
) WITHOUT ROWID""",
    # No foreign key to conversations: a run is recorded before its first message is committed.
    f"""CREATE TABLE runs (
    request_id TEXT PRIMARY KEY NOT NULL,
    conversation_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'success', 'error', 'canceled')),
    error_code TEXT,
    error_message TEXT,
    {_USAGE_DDL},
    started_at_ms INTEGER NOT NULL,
    ended_at_ms INTEGER,
    CHECK ((status = 'running') = (ended_at_ms IS NULL))
)""",
    "CREATE INDEX runs_by_conversation ON runs(conversation_id, started_at_ms)",
    f"""CREATE TABLE llm_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    provider_id TEXT NOT NULL,
    model TEXT NOT NULL,
    request_body BLOB,
    request_sha256 TEXT NOT NULL,
    messages_sha256 TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'error', 'canceled')),
    error TEXT,
    http_status INTEGER,
    ttfb_ms INTEGER,
    ttft_ms INTEGER,
    duration_ms INTEGER,
    event_count INTEGER NOT NULL,
    byte_count INTEGER NOT NULL,
    {_USAGE_DDL},
    started_at_ms INTEGER NOT NULL
)""",
    "CREATE INDEX llm_calls_by_request ON llm_calls(request_id, id)",
    """CREATE TABLE blobs (
    id BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 32),
    data BLOB NOT NULL,
    size_bytes INTEGER NOT NULL CHECK (size_bytes = length(data)),
    created_at_ms INTEGER NOT NULL
) WITHOUT ROWID""",
    # Both ends must be stored blobs: a reference to a blob that was never received is refused here.
    """CREATE TABLE blob_edges (
    parent_id BLOB NOT NULL REFERENCES blobs(id),
    child_id BLOB NOT NULL REFERENCES blobs(id),
    kind TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    PRIMARY KEY (parent_id, kind, ordinal)
) WITHOUT ROWID""",
    "CREATE INDEX blob_edges_by_child ON blob_edges(child_id)",
)

# Version 2: call-record observability. All nullable, so rows written by version 1 read back as
# "not recorded" (NULL) rather than as a made-up value.
_V2: tuple[str, ...] = (
    # Run decided to call -> the recorded (last) attempt's request started; includes retry backoff.
    "ALTER TABLE llm_calls ADD COLUMN queue_ms INTEGER",
    "ALTER TABLE llm_calls ADD COLUMN attempts INTEGER",
    "ALTER TABLE llm_calls ADD COLUMN error_kind TEXT",
    # NULL: first call of its conversation (or the previous call's messages are unknown).
    "ALTER TABLE llm_calls ADD COLUMN prefix_extends INTEGER CHECK (prefix_extends IN (0, 1))",
    "ALTER TABLE llm_calls ADD COLUMN common_prefix_messages INTEGER",
    "ALTER TABLE llm_calls ADD COLUMN cache_hit_share REAL",
    # Raw response bytes, only with [logging] detailed = true (capped; see providers/runner.py).
    "ALTER TABLE llm_calls ADD COLUMN response_capture BLOB",
    # The prefix meter's fallback reads a conversation's last call after a restart.
    "CREATE INDEX llm_calls_by_conversation ON llm_calls(conversation_id, id)",
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    _V1,
    _V2,
    lineage.V3,
    call_bodies.V4,
    root_ids.V5,
    call_bodies.V6,
    rendered_prefixes.V7,
    call_bodies.V8,
    console_tables.V9,
)
assert len(MIGRATIONS) == SCHEMA_VERSION


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the database at ``path`` and bring its schema up to date."""
    if not path.exists():
        # Create the file ourselves so it starts private; SQLite gives -wal/-shm the same mode.
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    try:
        # isolation_level=None: the store issues BEGIN IMMEDIATE / COMMIT itself.
        # check_same_thread=False: the async wrapper reaches it from trio's worker threads, one at a time.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        raise StoreError(f"cannot open {path}: {e}") from e
    try:
        _configure(conn, path)
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


# Pages of a new database. A 2.4 MB tool result is ~600 overflow pages at SQLite's default 4 KiB,
# and its commit took 10-26 ms; at 16 KiB it took 3.3-5.0 ms, and a turn's small commits were no
# slower (0.40-0.69 against 0.52-0.87 ms). A database created earlier keeps its page size (in WAL
# mode SQLite cannot change it, and both work).
PAGE_SIZE = 16384
WAL_AUTOCHECKPOINT_BYTES = 64 * 2**20
# The WAL file is cut back to this when SQLite restarts it after a complete checkpoint, so its
# size tells roughly how much is waiting to be copied (and a past burst does not stay on disk).
WAL_SIZE_LIMIT_BYTES = 4 * 2**20


def _configure(conn: sqlite3.Connection, path: Path) -> None:
    try:
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect only on a new database
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        # SQLite checkpoints the WAL inside whichever COMMIT crosses the limit: with multi-MB tool
        # results that was every other append, on a turn's critical path. The daemon checkpoints
        # between runs instead (run/upkeep.py); this is only the safety net.
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_BYTES // page_size}")
        conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
    except sqlite3.Error as e:
        raise StoreError(f"cannot configure {path}: {e}") from e
    if str(mode).lower() != "wal":
        raise StoreError(f"{path}: SQLite refused WAL journal mode (got {mode!r})")


def migrate(conn: sqlite3.Connection) -> None:
    """Apply pending migrations in one write transaction (so two processes cannot both migrate)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"database schema version {version} is newer than this byok supports "
                    f"({SCHEMA_VERSION}); upgrade byok or point it at another data dir"
                )
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    conn.execute(statement)
            if version != SCHEMA_VERSION:
                # user_version lives in the header page, so it commits with the DDL or not at all.
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.Error as e:
        raise StoreError(f"cannot migrate schema: {e}") from e
