"""The daemon's one cache budget (``[server] cache_bytes``), applied to what it keeps of each
conversation for a fast next turn.

A conversation is charged (byok/cache_budget.py) at the end of each of its runs for:

- ``history``: its decoded history in the store's cache (store/history_cache.py);
- ``render``: its request fragments and final prefixes (providers/render_cache.py);
- ``calls``: the prefix meter's hashes of its last call and its element digests (CallLog);
- ``memory``: what it remembers of its client, root ids and acked ids (ConversationMemory).

Past the budget the least recently used conversations without a run are evicted whole: their
render is stored first (run/stored_render.py: their next turn starts from it), then all four
parts are dropped, and the next turn reads them back from SQLite as after a restart. A
conversation with a run is never evicted, so a single long conversation stays hot whatever its
size; the freed heap goes back to the OS with the upkeep between runs (run/upkeep.py).
"""

from __future__ import annotations

import logging

import trio

from byok.cache_budget import CacheBudget
from byok.providers import render_cache
from byok.run import call_meter
from byok.run.call_log import CallLog
from byok.run.conversation import Supervisors
from byok.run.stored_render import StoredRenders
from byok.store import AsyncStore, SQLiteStore, StoreError

log = logging.getLogger("byok.caches")

def own_cap(max_bytes: int) -> int:
    """What each cache may hold on its own (the store's decoded histories, one conversation's
    fragments or digests): a safety net above the budget, never below 32 MiB. Capped at a small
    budget, a cache would decline a long conversation's history or drop its fragments while
    their texts stay alive in what the run left behind, and the charge would undercount them;
    uncapped below that, it is charged in full and evicted once idle."""
    return max(max_bytes, 32 * 2**20)


class ConversationCaches:
    def __init__(
        self,
        max_bytes: int,
        *,
        store: AsyncStore,
        call_log: CallLog,
        renders: StoredRenders,
        supervisors: Supervisors,
    ) -> None:
        self.budget = CacheBudget(max_bytes)
        self.store = store
        self.call_log = call_log
        self.renders = renders
        self.supervisors = supervisors
        self.evicted = 0
        self._lock = trio.Lock()  # one eviction at a time
        render_cache.set_owned_max_bytes(own_cap(max_bytes))
        call_meter.set_owned_max_bytes(own_cap(max_bytes))

    def run_started(self, conversation_id: str) -> None:
        self.budget.pin(conversation_id)

    def charge(self, conversation_id: str) -> None:
        """Charge ``conversation_id`` for what the caches hold of it now; it becomes the most
        recently used."""
        b = self.budget
        b.charge(conversation_id, "history", self.store.cached_bytes_of(conversation_id))
        b.charge(conversation_id, "render", render_cache.owned_size(conversation_id))
        b.charge(conversation_id, "calls", self.call_log.kept_bytes(conversation_id))
        b.charge(conversation_id, "memory", self.supervisors.memory_bytes(conversation_id))

    async def run_ended(self, conversation_id: str) -> None:
        """After a run of ``conversation_id``: charge it, then evict what the budget no longer
        holds."""
        self.budget.unpin(conversation_id)
        self.charge(conversation_id)
        async with self._lock:
            for evicted in self.budget.evict():
                await self._drop(evicted)

    async def _drop(self, conversation_id: str) -> None:
        await self.renders.save(self.store, conversation_id)
        if self.budget.pinned(conversation_id):
            return  # a run started meanwhile: it uses these caches (charged again at its end)
        self.evicted += 1
        self.supervisors.forget(conversation_id)
        held = render_cache.forget_owner(conversation_id)
        await self.call_log.forget_conversation(conversation_id)
        try:
            await self.store.call(SQLiteStore.forget_conversation, conversation_id)
        except StoreError as e:
            log.warning("could not drop the cached history of conversation %s: %s", conversation_id, e)
        self.budget.drop(conversation_id)  # charged again if a run came and went meanwhile
        log.debug(
            "cache budget: evicted conversation %s (%.1f MiB of request fragments; %.1f of %.1f MiB used)",
            conversation_id,
            held / 2**20,
            self.budget.total / 2**20,
            self.budget.max_bytes / 2**20,
        )

    def close(self) -> None:
        """At shutdown: drop the render caches and digests of every conversation charged (the
        process may go on, as a test's does, and they are module-wide)."""
        for conversation_id in self.budget.lru_order():
            render_cache.forget_owner(conversation_id)
            call_meter.forget_element_digests(conversation_id)
            self.budget.drop(conversation_id)
