"""Per-conversation live state and the supervisor that keeps one active Run per conversation."""

from __future__ import annotations

import attrs
import trio

from byok.cursor.checkpoint import Blob


@attrs.define
class ConversationMemory:
    """What the daemon remembers about a conversation's client between runs.

    ``acked`` are the blob ids the client's KV store acknowledged (a restart forgets them and
    simply sends blobs again); ``roots`` caches root blobs by message id.
    """

    acked: set[bytes] = attrs.Factory(set)
    roots: dict[bytes, Blob] = attrs.Factory(dict)


@attrs.define(eq=False)
class ActiveRun:
    request_id: str
    scope: trio.CancelScope
    done: trio.Event


class ConversationSupervisor:
    """Owns the one active Run of a conversation: a new run cancels and awaits the old one."""

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        self.memory = ConversationMemory()
        self.active: ActiveRun | None = None
        self.lock = trio.Lock()

    async def preempt(self) -> None:
        old = self.active
        if old is not None:
            old.scope.cancel()
            await old.done.wait()


class Supervisors:
    def __init__(self) -> None:
        self._by_id: dict[str, ConversationSupervisor] = {}

    def get(self, conversation_id: str) -> ConversationSupervisor:
        sup = self._by_id.get(conversation_id)
        if sup is None:
            sup = self._by_id[conversation_id] = ConversationSupervisor(conversation_id)
        return sup
