"""A request body kept as the pieces a render made it from.

A long conversation's request is 5.7 MB at 5,000 messages, and almost all of it is the cached
JSON of its messages. Joined into one buffer it was copied on the render's path and held beside
the cache until the call was recorded. Kept as pieces it is sent, hashed and sliced piece by
piece; only a body stored whole (one call in 32) or redacted is ever joined.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Iterator

import attrs

# Pieces are handed out in groups up to this size: one socket write or hash update each.
CHUNK_BYTES = 1 << 20


@attrs.frozen
class SplicedBody:
    """``lead + b",".join(items) + trail``: ``lead`` runs through the message array's "[",
    ``items`` are its elements, ``trail`` starts at its "]"."""

    lead: bytes = attrs.field(repr=False)
    items: tuple[bytes, ...] = attrs.field(repr=False)
    trail: bytes = attrs.field(repr=False)
    size: int = attrs.field(init=False, eq=False)

    def __attrs_post_init__(self) -> None:
        n = len(self.items)
        size = len(self.lead) + sum(map(len, self.items)) + max(n - 1, 0) + len(self.trail)
        object.__setattr__(self, "size", size)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        if not self.items:
            return self.lead + self.trail
        pieces = list(self.items)
        pieces[0] = self.lead + pieces[0]
        pieces[-1] += self.trail
        return b",".join(pieces)

    @functools.cached_property
    def _ends(self) -> tuple[int, ...]:
        """Offset just past each item (a "," precedes every item but the first), worked out in C."""
        lead = len(self.lead)
        sums = itertools.accumulate(map(len, self.items))
        return tuple(map(operator.add, sums, range(lead, lead + len(self.items))))

    def pieces(self, start: int = 0, stop: int | None = None) -> Iterator[bytes | memoryview]:
        """The body's bytes ``[start:stop)``, in order, without copying any piece."""
        stop = self.size if stop is None else min(stop, self.size)
        if start >= stop:
            return
        lead = self.lead
        if start < len(lead):
            yield lead if start == 0 and stop >= len(lead) else memoryview(lead)[start:stop]
        items = self.items
        if items:
            ends = self._ends
            k = bisect.bisect_right(ends, start)
            while k < len(items):
                item = items[k]
                begin = ends[k] - len(item)
                if begin > stop:
                    return
                if k and start < begin:  # the "," at begin - 1
                    yield b","
                if begin == stop:
                    return
                a, b = max(start - begin, 0), min(stop - begin, len(item))
                yield item if a == 0 and b == len(item) else memoryview(item)[a:b]
                k += 1
        at = self.size - len(self.trail)
        if stop > at:
            a = max(start - at, 0)
            yield self.trail if a == 0 and stop == self.size else memoryview(self.trail)[a : stop - at]

    def chunks(self, start: int = 0, stop: int | None = None) -> Iterator[bytes | memoryview]:
        """``pieces`` grouped up to CHUNK_BYTES (a larger piece goes alone, uncopied)."""
        if start <= 0 and (stop is None or stop >= self.size):
            yield from self.whole_chunks()
            return
        group: list[bytes | memoryview] = []
        size = 0
        for piece in self.pieces(start, stop):
            if size and size + len(piece) > CHUNK_BYTES:
                yield group[0] if len(group) == 1 else b"".join(group)
                group, size = [], 0
            group.append(piece)
            size += len(piece)
        if group:
            yield group[0] if len(group) == 1 else b"".join(group)

    def whole_chunks(self) -> Iterator[bytes]:
        """The whole body: the lead, runs of items joined in C up to CHUNK_BYTES (the "," between
        two runs on its own), the trail. No Python step per item."""
        yield self.lead
        items, ends = self.items, self._ends
        i, n = 0, len(items)
        while i < n:
            begin = ends[i] - len(items[i])
            j = max(bisect.bisect_right(ends, begin + CHUNK_BYTES, i + 1), i + 1)
            if i:
                yield b","
            yield items[i] if j == i + 1 else b",".join(items[i:j])
            i = j
        yield self.trail

    def slice(self, start: int, stop: int) -> bytes:
        return b"".join(self.pieces(start, stop))


Body = bytes | SplicedBody


def as_bytes(body: Body) -> bytes:
    return body if isinstance(body, bytes) else bytes(body)


def view(body: Body, start: int, stop: int) -> bytes | memoryview:
    """``body[start:stop]``: a view of a plain body, the joined pieces of a spliced one."""
    if isinstance(body, bytes):
        return memoryview(body)[start:stop]
    return body.slice(start, stop)


def chunks(body: Body, start: int = 0, stop: int | None = None) -> Iterator[bytes | memoryview]:
    if isinstance(body, bytes):
        yield memoryview(body)[start:stop]
        return
    yield from body.chunks(start, stop)
