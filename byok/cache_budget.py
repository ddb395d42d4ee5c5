"""CacheBudget: one byte budget for what the daemon caches of all conversations (sans-IO: no
clock, no threads; the run service feeds it and acts on what it answers).

Each conversation is charged, part by part, for what the caches hold of it (its decoded history,
its request fragments, the prefix meter's hashes and digests, what it remembers of its client).
Past the budget the least recently used conversations go first, whole; a conversation with a
run is never chosen. So one long conversation stays hot however long it is, while a thousand
idle ones cost no more than the budget: not a timer, which emptied the caches of a user who
paused for ten minutes and kept everything of one who never did.
"""

from __future__ import annotations

from collections import OrderedDict


class CacheBudget:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"a cache budget must be > 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        # conversation -> its parts' charges, least recently used first.
        self._charges: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._pins: dict[str, int] = {}
        self._total = 0

    @property
    def total(self) -> int:
        return self._total

    def __len__(self) -> int:
        return len(self._charges)

    def __contains__(self, owner: str) -> bool:
        return owner in self._charges

    def size_of(self, owner: str) -> int:
        return sum(self._charges.get(owner, {}).values())

    def lru_order(self) -> list[str]:
        """The conversations charged, least recently used first."""
        return list(self._charges)

    def charge(self, owner: str, part: str, size: int) -> None:
        """``owner``'s ``part`` holds ``size`` bytes now (0 forgets the part); ``owner`` becomes
        the most recently used."""
        if size < 0:
            raise ValueError(f"a charge cannot be negative: {owner!r} {part!r} {size}")
        parts = self._charges.get(owner)
        if parts is None:
            parts = self._charges[owner] = {}
        else:
            self._charges.move_to_end(owner)
        self._total += size - parts.pop(part, 0)
        if size:
            parts[part] = size

    def touch(self, owner: str) -> None:
        """``owner`` was used: it becomes the most recently used."""
        if owner in self._charges:
            self._charges.move_to_end(owner)

    def pin(self, owner: str) -> None:
        """``owner`` has a run: never evicted until unpinned as often as pinned."""
        self._pins[owner] = self._pins.get(owner, 0) + 1
        self.touch(owner)

    def unpin(self, owner: str) -> None:
        count = self._pins.get(owner, 0)
        if count <= 1:
            self._pins.pop(owner, None)
        else:
            self._pins[owner] = count - 1

    def pinned(self, owner: str) -> bool:
        return owner in self._pins

    def drop(self, owner: str) -> None:
        """Forget ``owner``'s charges (its caches were dropped)."""
        parts = self._charges.pop(owner, None)
        if parts is not None:
            self._total -= sum(parts.values())

    def evict(self) -> list[str]:
        """The conversations whose caches must go, least recently used first, until the rest fit
        the budget (or only pinned ones are left); they are no longer charged. A conversation
        larger than the whole budget goes as soon as it is not pinned."""
        out: list[str] = []
        if self._total <= self.max_bytes:
            return out
        for owner in list(self._charges):
            if self._total <= self.max_bytes:
                break
            if owner in self._pins:
                continue
            self.drop(owner)
            out.append(owner)
        return out
