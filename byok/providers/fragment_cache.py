"""A least-recently-used cache bounded by the total size of what it holds (sans-IO, no clock).

Request building caches each history item's JSON so a long conversation re-serialises only what
is new; bounding the cache by bytes rather than entries keeps a few long conversations (each
item ~1.5 KB, some megabytes) from pinning their whole content after the store let it go.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class SizedLru(Generic[V]):
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        if size > self.max_bytes:
            return  # would evict everything else and still not fit
        old = self._items.pop(key, None)
        if old is not None:
            self._size -= old[1]
        self._items[key] = (value, size)
        self._size += size
        while self._size > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self._size -= dropped

    def clear(self) -> None:
        self._items.clear()
        self._size = 0
