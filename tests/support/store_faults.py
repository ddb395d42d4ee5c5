"""A disk that refuses writes, for the daemon's store in this process."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from byok.store import SQLiteStore

# SQLite's largest max_page_count: no limit.
NO_PAGE_LIMIT = 1_073_741_823


def before_each_write(monkeypatch: pytest.MonkeyPatch, hook: Callable[[sqlite3.Connection], None]) -> None:
    """Run ``hook(connection)`` before every write transaction of any SQLiteStore in this process,
    on the thread that runs it. A hook that sets ``PRAGMA query_only = 1`` makes the transaction
    fail as on a read-only disk (SQLITE_READONLY); one that pins ``max_page_count`` at
    ``page_count`` makes any write that needs a new page fail as on a full one (SQLITE_FULL)."""
    original = SQLiteStore._transaction

    def transaction(store: SQLiteStore, *, write: bool, **options: Any) -> Any:
        if write and store._conn is not None:
            hook(store._conn)
        return original(store, write=write, **options)

    monkeypatch.setattr(SQLiteStore, "_transaction", transaction)
