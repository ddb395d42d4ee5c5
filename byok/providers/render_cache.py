"""The rendered texts kept for fast next renders: each history item's (or merged group's) JSON
texts, and each adapter's last *final prefix* (the texts no later render can change), per
conversation.

A render inside ``owned_by(conversation_id)`` (the run's provider call) keeps its texts in that
conversation's own cache, so they go together with its other caches when the daemon's one byte
budget evicts it (byok/cache_budget.py), and ``owned_size`` is what it is charged for them. A
render with no owner (tests, tools, the benchmarks' pure calls) uses ``FRAGMENTS``, a shared
cache bounded by bytes on its own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

import attrs

from byok.providers.fragment_cache import SizedLru


def _fragment_size(_key: Hashable, texts: tuple[bytes, ...]) -> int:
    # The texts plus the item's own text: the key keeps that alive once the store has evicted the
    # decoded history it came from.
    return sum(2 * len(t) + 100 for t in texts) + 100


# Cache key -> the texts it renders to, for renders without an owner. Shared by the three
# adapters (keys start with the kind).
FRAGMENTS: SizedLru[Hashable, tuple[bytes, ...]] = SizedLru(24 * 2**20, _fragment_size)
# Conversation -> its own cache; each bounded by ``owned_max_bytes`` (the daemon sets its budget).
_OWNED: dict[Hashable, SizedLru[Hashable, tuple[bytes, ...]]] = {}
_owned_max = [256 * 2**20]
_OWNER: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar("byok_render_owner", default=None)


def set_owned_max_bytes(max_bytes: int) -> None:
    """The most one conversation's render cache may hold (the daemon's cache budget)."""
    _owned_max[0] = max_bytes
    for cache in _OWNED.values():
        cache.max_bytes = max_bytes


@contextlib.contextmanager
def owned_by(owner: Hashable) -> Iterator[None]:
    """Renders in this block keep their texts in ``owner``'s cache."""
    token = _OWNER.set(owner)
    try:
        yield
    finally:
        _OWNER.reset(token)


def _fragments() -> SizedLru[Hashable, tuple[bytes, ...]]:
    owner = _OWNER.get()
    if owner is None:
        return FRAGMENTS
    cache = _OWNED.get(owner)
    if cache is None:
        cache = _OWNED[owner] = SizedLru(_owned_max[0], _fragment_size)
    return cache


def cached(key: Hashable, render: Callable[..., Iterable[bytes]], *args: Any) -> tuple[bytes, ...]:
    """The texts of ``key``, rendered by ``render(*args)`` when not cached."""
    fragments = _fragments()
    texts = fragments.get(key)
    if texts is None:
        texts = tuple(render(*args))
        fragments.put(key, texts)
    return texts


@attrs.frozen
class _Prefix:
    match: tuple[Hashable, ...]  # a history that starts with these items...
    count: int  # ...renders its first ``count`` items (at most len(match)) to texts that
    texts: tuple[bytes, ...]  # can no longer change: these
    size: int  # bytes of texts


# The last render's final prefix per (owner, adapter key: kind, settings the texts depend on): a
# turn looks up only the items its history added. At 5,000 messages the per-item lookups were
# ~2.6 ms of every warm render. Without an owner, at most 8 are kept.
_PREFIXES: dict[tuple[Hashable | None, Hashable], _Prefix] = {}
_MAX_UNOWNED_PREFIXES = 8


def rendered_prefix(key: Hashable, history: tuple[Hashable, ...]) -> tuple[int, list[bytes], int]:
    """``(count, texts, size)``: the texts the first ``count`` items of ``history`` render to,
    from the last render under ``key`` if ``history`` starts with what it kept; else
    ``(0, [], 0)``. Item equality is the test (identical objects compare at C speed): equal
    items render to equal texts."""
    kept = _PREFIXES.get((_OWNER.get(), key))
    if kept is not None:
        n = len(kept.match)
        if n <= len(history) and history[:n] == kept.match:
            return kept.count, list(kept.texts), kept.size
    return 0, [], 0


def keep_prefix(
    key: Hashable, match: tuple[Hashable, ...], count: int, texts: list[bytes], size: int
) -> None:
    """Remember, for the next render under ``key``, that a history starting with ``match``
    renders its first ``count`` items to ``texts`` (``size`` bytes). Its texts, and the items'
    own texts, stay alive after the caches let them go, so a prefix counts twice its size as a
    fragment does: an owner's are charged to it; the unowned ones together hold no more than
    ``FRAGMENTS`` may (the oldest go first)."""
    owner = _OWNER.get()
    _PREFIXES.pop((owner, key), None)
    limit = FRAGMENTS.max_bytes if owner is None else _owned_max[0]
    if not count or 2 * size > limit:
        return
    _PREFIXES[(owner, key)] = _Prefix(match, count, tuple(texts), size)
    if owner is not None:
        return
    unowned = [k for k in _PREFIXES if k[0] is None]
    total = sum(2 * _PREFIXES[k].size for k in unowned)
    while len(unowned) > _MAX_UNOWNED_PREFIXES or total > FRAGMENTS.max_bytes:
        total -= 2 * _PREFIXES.pop(unowned.pop(0)).size


def owned_size(owner: Hashable) -> int:
    """The bytes ``owner``'s renders keep, estimated: its fragments, or its final prefixes' texts
    (counted as fragments are) when those are more. Both hold mostly the same texts; a prefix
    holds texts no fragment does when its render started from a stored one."""
    cache = _OWNED.get(owner)
    prefixes = sum(2 * kept.size for (who, _key), kept in _PREFIXES.items() if who == owner)
    return max(cache.size if cache is not None else 0, prefixes)


def forget_owner(owner: Hashable) -> int:
    """Drop ``owner``'s render caches; returns the bytes its fragments held."""
    cache = _OWNED.pop(owner, None)
    for k in [k for k in _PREFIXES if k[0] == owner]:
        del _PREFIXES[k]
    return cache.size if cache is not None else 0


def forget_rendered() -> int:
    """Drop every cached render (fragments and kept prefixes, owned or not); returns the bytes
    the fragment caches held."""
    held = FRAGMENTS.size + sum(cache.size for cache in _OWNED.values())
    FRAGMENTS.clear()
    _OWNED.clear()
    _PREFIXES.clear()
    return held
