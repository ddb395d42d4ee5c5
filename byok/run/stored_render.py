"""A long history's render, kept across restarts and the eviction of a conversation's caches.

After a restart (or once the cache budget evicted the conversation) the first call of a
conversation read its whole history back, decoded it, projected it and rendered it: ~0.1-0.15 s at 5,000
messages, before the request could go out. Now the history's first messages come from the store
undecoded (Message.stored), and a stored render of them (store/rendered_prefixes.py) stands for
their projection (RenderedPrefix): only the messages after it are decoded, projected and rendered.

A render is saved when the cache budget evicts a conversation called since its last save, and
at shutdown for each one called since, by the adapter of its last call. A daemon killed before
that loses only the speed: its histories render from scratch once. A stored render is used only
when the history's first messages have exactly the ids it was made of, and when it was made by
this very rendering code (its key includes a digest of the modules that render): an upgrade
never mixes two formats in one body.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import logging
import pkgutil
from collections.abc import Hashable
from pathlib import Path

import attrs

from byok.model.messages import Message
from byok.model.projection import final_prefix, project, projected_count, start_from
from byok.model.request import ModelRequest, RenderedPrefix
from byok.providers.adapters import Adapter, adapter_for
from byok.providers.render_cache import owned_by
from byok.store import AsyncStore, StoreError
from byok.store.rendered_prefixes import messages_digest

log = logging.getLogger("byok.render")

# Below this many messages a history renders from scratch in about a millisecond: no store trip.
MIN_MESSAGES = 64

# The packages whose code decides the texts a history renders to: every module of them, so a
# module added to the rendering (or forgotten in a list) can never leave the key unchanged.
_RENDERING_PACKAGES = ("byok.model", "byok.providers")


def _rendering_modules() -> list[str]:
    names: list[str] = []
    for package in _RENDERING_PACKAGES:
        path = importlib.import_module(package).__path__
        names += sorted(f"{package}.{m.name}" for m in pkgutil.iter_modules(path))
    return names


@functools.cache
def _code_digest() -> bytes:
    digest = hashlib.sha256()
    for name in _rendering_modules():
        source = importlib.import_module(name).__file__
        try:
            digest.update(Path(source or name).read_bytes())
        except OSError:  # not a file (a zip import): the release names the code
            digest.update(f"{name} {importlib.metadata.version('byok')}".encode())
    return digest.digest()


def render_key(key: Hashable) -> bytes:
    """The stored form of an adapter's prefix key (kind, and what its texts depend on)."""
    return hashlib.sha256(_code_digest() + repr(key).encode()).digest()


async def start_from_stored(
    store: AsyncStore,
    conversation_id: str,
    messages: tuple[Message, ...],
    adapter: Adapter,
    template: ModelRequest,
) -> bool:
    """Before ``messages`` are projected for a call by ``adapter`` (``template``: the call's
    request, its history aside): when this process has not projected them and a stored render of
    their first messages matches, make it their projection's start. True when it did."""
    if len(messages) < MIN_MESSAGES or projected_count(messages):
        return False
    key = adapter.prefix_key(template)
    try:
        stored = await store.rendered_prefix(conversation_id, render_key(key))
    except StoreError as e:  # derived data: the history renders from scratch
        log.warning("could not read the stored render of conversation %s: %s", conversation_id, e)
        return False
    if stored is None or not 0 < stored.message_count <= len(messages):
        return False
    count = stored.message_count
    covered = messages[:count]
    if messages_digest(m.id for m in covered) != stored.messages_sha256:
        return False  # an edit branched before its end
    start_from(messages, RenderedPrefix(key, stored.texts, covered, sum(map(len, stored.texts))))
    log.debug("conversation %s: its first %d messages from their stored render", conversation_id, count)
    return True


@attrs.define
class StoredRenders:
    """The conversations called since the last save, with their last call's adapter and request
    (its history aside): what the next save renders and stores."""

    _pending: dict[str, tuple[Adapter, ModelRequest]] = attrs.Factory(dict)

    def called(self, conversation_id: str, adapter: Adapter, template: ModelRequest) -> None:
        """``template``: the call's request, its history aside (empty)."""
        self._pending[conversation_id] = (adapter, template)

    async def request(
        self,
        store: AsyncStore,
        conversation_id: str,
        messages: tuple[Message, ...],
        kind: str,
        template: ModelRequest,
    ) -> ModelRequest:
        """A call's request by the adapter of ``kind``: ``template`` with the projection of
        ``messages``, started from their stored render when this process never projected them."""
        adapter = adapter_for(kind)
        await start_from_stored(store, conversation_id, messages, adapter, template)
        self.called(conversation_id, adapter, template)
        return attrs.evolve(template, history=project(messages))

    async def save(self, store: AsyncStore, conversation_id: str) -> int:
        """Store ``conversation_id``'s render if it was called since its last save (before the
        cache budget evicts it); how many rows were written."""
        pending = self._pending.pop(conversation_id, None)
        if pending is None:
            return 0
        return await _save_logged(store, conversation_id, *pending)

    async def save_all(self, store: AsyncStore) -> int:
        """Store the render of each pending conversation's final prefix (the messages no later
        one can change); returns how many rows were written."""
        pending, self._pending = self._pending, {}
        written = 0
        for conversation_id, (adapter, template) in pending.items():
            written += await _save_logged(store, conversation_id, adapter, template)
        return written


async def _save_logged(
    store: AsyncStore, conversation_id: str, adapter: Adapter, template: ModelRequest
) -> int:
    try:
        return await _save(store, conversation_id, adapter, template)
    except StoreError as e:
        log.warning("could not store the render of conversation %s: %s", conversation_id, e)
    except Exception:  # a row that does not decode: its next turn will say so; not the caller's end
        log.exception("could not render conversation %s to store it", conversation_id)
    return 0


async def _save(store: AsyncStore, conversation_id: str, adapter: Adapter, template: ModelRequest) -> bool:
    messages = (await store.head(conversation_id)).messages
    count, items = final_prefix(messages)
    if count < MIN_MESSAGES:
        return False
    with owned_by(conversation_id):  # its own fragments: most of it is rendered already
        key, texts = adapter.prefix_texts(attrs.evolve(template, history=items))
    digest = messages_digest(m.id for m in messages[:count])
    return await store.save_rendered_prefix(conversation_id, render_key(key), count, digest, texts)
