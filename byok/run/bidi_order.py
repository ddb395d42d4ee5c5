"""Per-request ordering of BidiAppend messages by append_seqno (sans-IO).

Cursor numbers appends from 0 and sends them one at a time; gaps come only from retries
or faults. An early append is buffered (bounded), a duplicate is dropped idempotently.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")

MAX_BUFFERED = 64
MAX_BUFFERED_BYTES = 8 * 1024 * 1024


class OrderBufferFull(Exception):
    pass


class AppendOrder(Generic[T]):
    def __init__(self, max_buffered: int = MAX_BUFFERED, max_bytes: int = MAX_BUFFERED_BYTES) -> None:
        self.next_seqno = 0
        self._early: dict[int, tuple[T, int]] = {}
        self._early_bytes = 0
        self._max_buffered = max_buffered
        self._max_bytes = max_bytes

    def offer(self, seqno: int, item: T, size: int) -> list[T]:
        """Accept one append; return the items that are now deliverable, in seqno order."""
        if seqno < self.next_seqno or seqno in self._early:
            return []
        if seqno > self.next_seqno:
            if len(self._early) >= self._max_buffered or self._early_bytes + size > self._max_bytes:
                raise OrderBufferFull(
                    f"too many early appends buffered (waiting for seqno {self.next_seqno})"
                )
            self._early[seqno] = (item, size)
            self._early_bytes += size
            return []
        out = [item]
        self.next_seqno += 1
        while self.next_seqno in self._early:
            early, early_size = self._early.pop(self.next_seqno)
            self._early_bytes -= early_size
            out.append(early)
            self.next_seqno += 1
        return out

    def is_duplicate(self, seqno: int) -> bool:
        return seqno < self.next_seqno or seqno in self._early

    def clear(self) -> None:
        self._early.clear()
        self._early_bytes = 0
