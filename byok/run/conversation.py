"""Per-conversation live state and the supervisor that keeps one active Run per conversation."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import attrs
import trio

from byok.cursor.checkpoint import Blob, RootList, root_blob
from byok.cursor.todos import TodoFold
from byok.model.messages import Message

log = logging.getLogger("byok.run")

# Below this many messages without a known root id, encoding them again (~10 us each) is cheaper
# than a store trip for the saved ones.
RECALL_MIN = 64


@attrs.define
class ConversationMemory:
    """What the daemon remembers about a conversation's client between runs.

    ``acked`` are the blob ids the client's KV store acknowledged (a restart forgets them; the
    client's checkpoint tells them again). ``root_ids`` maps the id of every message a
    checkpoint listed to its root blob without data (made once: every checkpoint lists every
    root, and thousands of fresh Blobs per publish fed the cyclic GC). ``roots`` holds whole root
    blobs only until the client ACKs them: an idle 5,000-message conversation keeps ids
    (~1 MiB), not its content (~8 MiB). ``unsaved`` are root ids worked out since the store last
    saved them (store/root_ids.py); ``recalled``: the saved ones have been read back, or were
    found not worth a trip.
    """

    acked: set[bytes] = attrs.Factory(set)
    root_ids: dict[bytes, Blob] = attrs.Factory(dict)
    roots: dict[bytes, Blob] = attrs.Factory(dict)
    unsaved: dict[bytes, bytes] = attrs.Factory(dict)
    recalled: bool = False
    # The encoded root list of the history's settled prefix (checkpoint.RootList).
    root_list: RootList = attrs.Factory(RootList)
    # The summaries this process made a provider call on (their event ids): a call on a history
    # that starts with another one is the first on a compacted history (an edit back to an older
    # summary is not).
    summaries_called: set[str] = attrs.Factory(set)
    # The todo list folded over the history (cursor/todos.py): checkpoints and TodoWrite read it.
    todos: TodoFold = attrs.Factory(TodoFold)

    def root_of(self, message: Message, *, with_data: bool = False) -> Blob:
        """``message``'s root blob. Once the client holds it, only its id is needed (a checkpoint
        lists it and KvLink.put skips it), so the data comes back empty unless ``with_data``."""
        key = message.id
        held = self.root_ids.get(key)
        if held is not None and held.id in self.acked:
            self.roots.pop(key, None)
            if not with_data:
                return held
        blob = self.roots.get(key)
        if blob is None:
            blob = root_blob(message)
            self.root_ids[key] = Blob(blob.id, b"")
            if held is None or held.id != blob.id:
                self.unsaved[key] = blob.id
            if blob.id not in self.acked:
                self.roots[key] = blob
        return blob

    def root_id_of(self, message: Message) -> bytes:
        """The root id byok published for ``message`` (saved or remembered), else its own."""
        held = self.root_ids.get(message.id)
        return held.id if held is not None else root_blob(message).id

    def needs_recall(self, messages: Sequence[Message]) -> bool:
        """Whether reading the saved root ids back is worth a store trip (once per daemon life)."""
        if self.recalled:
            return False
        if len(messages) < RECALL_MIN:
            return False
        missing = sum(1 for m in messages if m.id not in self.root_ids)
        if missing < RECALL_MIN:
            # This daemon knows the history: every message added later is encoded here, so the
            # saved ids will never be worth a trip (and later checkpoints skip this count).
            self.recalled = True
            return False
        return True

    def recall(self, saved: Mapping[bytes, bytes]) -> None:
        """Take the saved root ids; what this daemon worked out itself wins."""
        self.recalled = True
        for key, root_id in saved.items():
            if key not in self.root_ids:
                self.root_ids[key] = Blob(root_id, b"")

    def saved(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """``pairs`` (taken from ``unsaved``) are in the store now."""
        for key, root_id in pairs:
            if self.unsaved.get(key) == root_id:
                del self.unsaved[key]
        if not self.unsaved:
            self.unsaved = {}  # a dict keeps its table after deletions: ~0.3 MiB at 5,000

    def approx_bytes(self) -> int:
        """What this memory holds, estimated for the cache budget (a root id's entry ~250 bytes:
        its key, its Blob and their dict slot; an acked id ~120; an unACKed root its data)."""
        return (
            1024
            + 250 * len(self.root_ids)
            + 120 * len(self.acked)
            + sum(200 + len(blob.data) for blob in self.roots.values())
            + 150 * len(self.unsaved)
            + self.root_list.size
        )

    def drop_acked_roots(self) -> None:
        """Forget the data of every root blob the client now holds (after a publish's ACKs)."""
        for key in [k for k, blob in self.roots.items() if blob.id in self.acked]:
            del self.roots[key]


@attrs.define(eq=False)
class ActiveRun:
    request_id: str
    scope: trio.CancelScope
    done: trio.Event
    # What `byok status` shows of it.
    conversation_id: str = ""
    model_id: str = ""
    started_ms: int = 0


class ConversationSupervisor:
    """Owns the one active Run of a conversation: a new run cancels and awaits the old one before
    it touches the conversation."""

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        self.memory = ConversationMemory()
        self.active: ActiveRun | None = None

    async def run(self, me: ActiveRun, body: Callable[[trio.CancelScope], Awaitable[None]]) -> None:
        """Run ``body`` in ``me``'s cancel scope once the run it preempts has ended."""
        old, self.active = self.active, me
        try:
            if old is not None:
                log.info("run %s preempts run %s", me.request_id, old.request_id)
                old.scope.cancel()
                await old.done.wait()
            await body(me.scope)
        finally:
            me.done.set()
            if self.active is me:
                self.active = None


class Supervisors:
    """One supervisor per conversation with a run now or recently. An idle one (no active run)
    is forgotten when the cache budget evicts its conversation (run/conversation_caches.py): its
    next run starts as after a restart (the client's checkpoint tells the acked roots again, the
    store the saved root ids). One with an active run is never forgotten: its ``active`` is how
    a new run finds the one to preempt."""

    def __init__(self) -> None:
        self._by_id: dict[str, ConversationSupervisor] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def peek(self, conversation_id: str) -> ConversationSupervisor | None:
        """The conversation's supervisor if it has one, without making one."""
        return self._by_id.get(conversation_id)

    def get(self, conversation_id: str) -> ConversationSupervisor:
        sup = self._by_id.get(conversation_id)
        if sup is None:
            sup = self._by_id[conversation_id] = ConversationSupervisor(conversation_id)
        return sup

    def memory_bytes(self, conversation_id: str) -> int:
        sup = self._by_id.get(conversation_id)
        return 0 if sup is None else sup.memory.approx_bytes()

    def forget(self, conversation_id: str) -> bool:
        """Forget ``conversation_id`` unless it has an active run; whether it was forgotten."""
        sup = self._by_id.get(conversation_id)
        if sup is None or sup.active is not None:
            return False
        del self._by_id[conversation_id]
        return True
