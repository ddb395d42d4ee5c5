"""HistoryCache: decoded conversation histories kept by SQLiteStore, bounded in bytes.

Sound because a committed revision id names one history forever (AUTOINCREMENT, no updates) and
only committed revisions are cached. The cache is bounded by the size of the message data it holds,
across all conversations; only each conversation's most recent revision is kept (a run reads and
appends at its head, and the revisions of one chain share their Message objects anyway).
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from byok.model.messages import Message
from byok.store.records import Head

DEFAULT_CACHE_BYTES = 32 * 2**20


def message_size(message: Message) -> int:
    """Approximate bytes a decoded message holds (its strings plus object overhead): what the
    history cache budget counts."""
    stored = message.stored_size
    if stored is not None:  # not decoded yet: its row's bytes
        return 200 + stored
    size = 400 + len(message.text) + len(message.thinking)
    if message.replay is not None:
        size += len(message.replay.data)
    for call in message.tool_calls:
        size += 200 + len(call.arguments)
    for part in message.attachments:
        size += 200 + len(part.data)
    return size + message.encoded_size  # a message appended by this process keeps its bytes


@attrs.frozen
class _Cached:
    conversation_id: str | None  # None: read by revision alone (messages_at)
    messages: tuple[Message, ...]
    size: int


class HistoryCache:
    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        # revision id -> its decoded history, least recently used first.
        self._entries: OrderedDict[int, _Cached] = OrderedDict()
        self._by_conversation: dict[str, int] = {}
        self._size = 0
        self.max_bytes = max_bytes

    @property
    def size(self) -> int:
        return self._size

    def get(self, revision_id: int) -> tuple[Message, ...] | None:
        cached = self._entries.get(revision_id)
        if cached is None:
            return None
        self._entries.move_to_end(revision_id)
        return cached.messages

    def size_of(self, conversation_id: str) -> int:
        """Bytes of ``conversation_id``'s cached history (0 when none)."""
        revision_id = self._by_conversation.get(conversation_id)
        cached = None if revision_id is None else self._entries.get(revision_id)
        return 0 if cached is None else cached.size

    def forget(self, conversation_id: str) -> None:
        """Drop ``conversation_id``'s cached history."""
        revision_id = self._by_conversation.get(conversation_id)
        if revision_id is not None:
            self._drop(revision_id)

    def clear(self) -> None:
        self._entries.clear()
        self._by_conversation.clear()
        self._size = 0

    def remember(self, head: Head) -> None:
        if head.revision_id is not None:
            self.remember_revision(head.revision_id, head.messages, head.conversation_id)

    def remember_revision(
        self, revision_id: int, messages: tuple[Message, ...], conversation_id: str | None
    ) -> None:
        # Called only after COMMIT: a rolled-back revision id may be handed out again.
        cached = self._entries.get(revision_id)
        if cached is not None:
            self._entries.move_to_end(revision_id)
            return
        size = 0
        if conversation_id is not None:
            older = self._by_conversation.get(conversation_id)
            if older is not None:
                prev = self._drop(older)
                if prev is not None and 0 < len(prev.messages) <= len(messages):
                    k = len(prev.messages)
                    if messages[k - 1] is prev.messages[-1]:  # an append shares its parent's objects
                        size = prev.size + sum(message_size(m) for m in messages[k:])
            self._by_conversation[conversation_id] = revision_id
        if not size:
            size = sum(message_size(m) for m in messages)
        if size > self.max_bytes:
            if conversation_id is not None:
                self._by_conversation.pop(conversation_id, None)
            return
        self._entries[revision_id] = _Cached(conversation_id, messages, size)
        self._size += size
        while self._size > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, revision_id: int) -> _Cached | None:
        cached = self._entries.pop(revision_id, None)
        if cached is not None:
            self._size -= cached.size
            cid = cached.conversation_id
            if cid is not None and self._by_conversation.get(cid) == revision_id:
                del self._by_conversation[cid]
        return cached
