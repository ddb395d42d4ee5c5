"""The store: SQLite source of truth for conversation history, runs, provider calls and blobs."""

from byok.store.async_store import AsyncStore
from byok.store.errors import RunExists, StaleRevision, StoreError
from byok.store.records import (
    BlobEdge,
    BodyBase,
    ComparedPrefix,
    Head,
    LlmCallRecord,
    LlmCallStatus,
    RunRecord,
    RunStatus,
)
from byok.store.sqlite_store import DB_FILENAME, SQLiteStore

__all__ = [
    "DB_FILENAME",
    "AsyncStore",
    "BlobEdge",
    "BodyBase",
    "ComparedPrefix",
    "Head",
    "LlmCallRecord",
    "LlmCallStatus",
    "RunExists",
    "RunRecord",
    "RunStatus",
    "SQLiteStore",
    "StaleRevision",
    "StoreError",
]
