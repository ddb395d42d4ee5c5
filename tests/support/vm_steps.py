"""How much SQLite work a query does, counted without a clock: tests of what a query reads."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable


def vm_steps(conn: sqlite3.Connection, run: Callable[[], object]) -> int:
    """SQLite VM instructions, in hundreds, that ``run`` makes ``conn`` execute."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        run()
    finally:
        conn.set_progress_handler(None, 0)
    return count
