"""A least-recently-used cache bounded by the total size of what it holds (sans-IO, no clock).

Request building caches each history item's JSON so a long conversation re-serialises only what
is new; bounding the cache by bytes rather than entries keeps a few long conversations (each
item ~1.5 KB, some megabytes) from pinning their whole content after the store let it go.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedLru(Generic[K, V]):
    """``size_of(key, value)``: the bytes an entry counts for. Worked out again when the entry
    leaves rather than stored beside it: keeping a (value, size) pair per entry cost 0.34 MiB
    more for a 5,000-message conversation's request fragments."""

    def __init__(self, max_bytes: int, size_of: Callable[[K, V], int]) -> None:
        self.max_bytes = max_bytes
        self.size_of = size_of
        self._items: OrderedDict[K, V] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        size = self.size_of(key, value)
        if size > self.max_bytes:
            return  # would evict everything else and still not fit
        old = self._items.pop(key, None)
        if old is not None:
            self._size -= self.size_of(key, old)
        self._items[key] = value
        self._size += size
        while self._size > self.max_bytes:
            dropped_key, dropped = self._items.popitem(last=False)
            self._size -= self.size_of(dropped_key, dropped)

    def clear(self) -> None:
        self._items.clear()
        self._size = 0
