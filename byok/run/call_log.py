"""Provider-call records, written off the run's path in batches.

A run hands each finished provider call to ``CallLog.submit`` (never blocks, never touches
SQLite); one writer task owned by the daemon finalizes everything queued on a worker thread of
its own, then writes it in one transaction per batch (the store's one worker does only the
INSERT). Finalizing fills in what call_meter derives, the prefix meter among it: each call is
compared with its conversation's previous call, whose per-message hashes live in a bounded LRU
keyed by conversation. A conversation not in it (after a restart or eviction) is compared with
its last recorded call in SQLite: first with that call's compared prefix (schema 6: a call that
holds all of it extends it, and its body is a tail of that one), else with the stored body,
walked for the same hashes (each element's exact span).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import attrs
import trio

from byok.model.body import Body
from byok.run.body_chain import BodyLayout, shared_bytes
from byok.run.call_meter import (
    Finalized,
    compare_prefix,
    digests_size,
    extends_compared,
    finalize_with_layout,
    forget_element_digests,
    stored_last,
)
from byok.store import AsyncStore, BodyBase, ComparedPrefix, LlmCallRecord, SQLiteStore, StoreError

log = logging.getLogger("byok.call_log")

# Conversations whose last call's message hashes are kept in memory.
MAX_CONVERSATIONS = 256
# Records waiting for the writer; beyond this (SQLite stalled for long) new ones are dropped.
MAX_PENDING = 1024
# On shutdown the writer stops starting writes after this long.
DRAIN_TIMEOUT_S = 10.0


# What SQLite gives of a conversation's last call after a restart: its compared prefix (the next
# call is checked against it without reading the body), or its id and whole body.
_Stored = ComparedPrefix | tuple[int, bytes | None]


@attrs.frozen
class _Last:
    """What the writer keeps of a conversation's last written call."""

    hashes: tuple[bytes, ...] | None  # the prefix meter's
    record_id: int | None = None  # its row, when the next body may be stored as a tail of it
    layout: BodyLayout | None = None


class CallLog:
    """Queue of call records and the task that writes them.

    ``detailed``: callers also capture raw response bytes into ``response_capture``.
    ``batches`` counts write transactions, ``dropped`` records refused by a full queue,
    ``failed`` records whose batch could not be written (logged).
    """

    def __init__(
        self,
        store: AsyncStore,
        *,
        detailed: bool = False,
        max_conversations: int = MAX_CONVERSATIONS,
        max_pending: int = MAX_PENDING,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        # Awaited before each batch: finalizing holds the GIL (a 5,000-message call's hashes were
        # 40 ms after a restart), and the run that made the call is still publishing its turn.
        self._quiet = quiet
        self.detailed = detailed
        self.batches = 0
        self.dropped = 0
        self.failed = 0
        self._send, self._receive = trio.open_memory_channel[LlmCallRecord](max_pending)
        self._max_conversations = max_conversations
        self._drain_timeout_s = drain_timeout_s
        # conversation -> its last written call. Touched only inside write jobs, which the lock
        # and the store's one-at-a-time worker serialize.
        self._previous: OrderedDict[str, _Last] = OrderedDict()
        self._carry: list[LlmCallRecord] = []  # taken off the channel, not written yet
        self._lock = trio.Lock()
        self._submitted = 0
        self._processed = 0
        self._progress = trio.Event()
        self._running = False
        # Told of every batch once written, with the rows' ids (the console's live stream).
        self.on_written: Callable[[list[LlmCallRecord]], None] | None = None

    def submit(self, rec: LlmCallRecord) -> None:
        """Queue ``rec`` for writing. Never blocks; safe inside a cancelled scope."""
        try:
            self._send.send_nowait(rec)
        except trio.WouldBlock:
            self.dropped += 1
            log.warning("call log queue full: dropped the record of a %s call", rec.provider_id)
            return
        self._submitted += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer. Runs until cancelled, then writes what is still queued (shielded, for at
        most ``drain_timeout_s``)."""
        if self._running:
            raise RuntimeError("CallLog.run is already running")
        self._running = True
        task_status.started()
        try:
            while True:
                self._carry.append(await self._receive.receive())
                if self._quiet is not None:
                    await self._quiet()
                await self._write_pending()
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self._drain_timeout_s):
                await self._write_pending()
            self._running = False
            left = len(self._carry) + self._receive.statistics().current_buffer_used
            if left:
                log.warning("call log: %d records not yet written at shutdown", left)
            self._wake()

    async def flush(self) -> None:
        """Wait until every record submitted so far is written (or its batch failed, logged).
        Without a running writer (before start, after shutdown) it writes them itself."""
        target = self._submitted
        while self._processed < target:
            if self._running:
                await self._progress.wait()
            else:
                await self._write_pending()
                if not self._running:
                    return

    def kept_bytes(self, conversation_id: str) -> int:
        """What is kept of ``conversation_id``'s last call, estimated for the cache budget: ~64
        bytes per compared element (its hash and layout entries) and its element digests."""
        last = self._previous.get(conversation_id)
        count = 0 if last is None or last.hashes is None else len(last.hashes)
        return 64 * count + digests_size(conversation_id)

    async def forget_conversation(self, conversation_id: str) -> None:
        """Drop what is kept of ``conversation_id``'s last call and its element digests (the
        cache budget evicted it); its next call is compared with SQLite's copy."""
        async with self._lock:
            self._previous.pop(conversation_id, None)
            forget_element_digests(conversation_id)

    async def forget(self) -> int:
        """Drop what is kept of every conversation's last call (the idle release); returns how
        many. Each one's next call is compared with its last call in SQLite, as after a restart.
        Kept, they grow with every conversation's length and outlive the caches they index."""
        async with self._lock:
            count = len(self._previous)
            self._previous.clear()
            return count

    # -- internals --------------------------------------------------------------------------

    def _wake(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def _take_queued(self) -> list[LlmCallRecord]:
        out = []
        while True:
            try:
                out.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                return out

    async def _write_pending(self) -> None:
        async with self._lock:
            batch, self._carry = self._carry + self._take_queued(), []
            if not batch:
                return
            remember: dict[str, tuple[int, _Last]] = {}
            ids: list[int] = []
            try:
                stored = await self._stored_previous(batch)
                # The hashing (and, rarely, a parse) on a thread of its own: the store's one
                # worker, which every conversation's next store call waits for, only inserts.
                finalize = self._finalize_batch
                records, remember, unproven = await trio.to_thread.run_sync(finalize, batch, stored)
                if unproven:
                    # A call that does not hold all of its predecessor's compared prefix (an
                    # edit, a new system prompt): only the bodies tell what they share.
                    stored.update(await self.store.call(_last_calls, sorted(unproven), True))
                    records, remember, unproven = await trio.to_thread.run_sync(finalize, batch, stored)
                    assert not unproven
                ids = await self.store.call(SQLiteStore.record_llm_calls, records)
            except trio.Cancelled:
                # Only raised before the insert ran (a started thread job is never abandoned):
                # nothing is written or remembered, and the batch goes again.
                self._carry = batch + self._carry
                raise
            except Exception:
                self.failed += len(batch)
                log.exception("call log: could not write %d call records", len(batch))
            else:
                self.batches += 1
                if self.on_written is not None:
                    try:
                        self.on_written([attrs.evolve(r, id=i) for r, i in zip(records, ids, strict=True)])
                    except Exception:
                        log.exception("call log: a listener failed")
            for conversation_id, (index, last) in remember.items():
                # A row that was not written cannot be a later body's base.
                row = ids[index] if ids else None
                kept = attrs.evolve(last, record_id=row) if row is not None else _Last(last.hashes)
                self._remember(conversation_id, kept)
            self._processed += len(batch)
            self._wake()

    async def _stored_previous(self, batch: list[LlmCallRecord]) -> dict[str, _Stored]:
        """What SQLite knows of the last call of each conversation of ``batch`` that is not in
        memory (after a restart or eviction): its compared prefix, or (older rows) its body.
        Walking a body is the finalize thread's job."""
        missing = {r.conversation_id for r in batch if r.conversation_id not in self._previous}
        if not missing:
            return {}
        return await self.store.call(_last_calls, sorted(missing), False)

    def _finalize_batch(
        self, batch: list[LlmCallRecord], stored: dict[str, _Stored]
    ) -> tuple[list[LlmCallRecord], dict[str, tuple[int, _Last]], set[str]]:
        """Finalize thread: each record's derived fields, prefix meter and storage base, and what
        to remember of each conversation's last record (by its index in the batch) once written;
        then the conversations whose stored body must be read to compare (none when the third
        item is empty). Reads ``_previous`` only: the writer's lock keeps it still."""
        records = []
        unproven: set[str] = set()
        # This batch's own earlier calls are not in SQLite yet, and the LRU may have evicted them.
        in_batch: dict[str, tuple[int, _Last]] = {}
        for index, sent in enumerate(batch):
            done = finalize_with_layout(sent)
            rec, current, layout = done.record, done.hashes, done.layout
            conversation_id = rec.conversation_id
            previous = None if conversation_id in in_batch else stored.get(conversation_id)
            if conversation_id not in self._previous and isinstance(previous, ComparedPrefix):
                extends, common, base = _against_prefix(previous, sent.request_body, done)
                if extends is None and current is not None:
                    unproven.add(conversation_id)
            else:
                if conversation_id in in_batch:
                    last = in_batch[conversation_id][1]  # no row id yet: not a base
                elif conversation_id in self._previous:
                    last = self._previous[conversation_id]
                elif previous is not None:
                    row_id, body = previous
                    hashes, stored_layout = stored_last(body)
                    last = _Last(hashes, row_id, stored_layout)
                else:
                    last = _Last(None)
                extends, common = compare_prefix(last.hashes, current)
                base = None
                if last.record_id is not None and last.layout is not None and layout is not None:
                    shared = shared_bytes(last.layout, layout)
                    base = BodyBase(last.record_id, shared) if shared else None
            if sent.new_prefix and extends is not True:
                extends = None  # a new prefix on purpose (a compaction): not a cache miss
            records.append(
                attrs.evolve(rec, prefix_extends=extends, common_prefix_messages=common, body_base=base)
            )
            in_batch[conversation_id] = (index, _Last(current, None, layout))
        return records, in_batch, unproven

    def _remember(self, conversation_id: str, last: _Last) -> None:
        if last.hashes is None:
            # Unknown messages: the next call falls back to SQLite, which knows no better.
            self._previous.pop(conversation_id, None)
            return
        self._previous[conversation_id] = last
        self._previous.move_to_end(conversation_id)
        while len(self._previous) > self._max_conversations:
            self._previous.popitem(last=False)


def _against_prefix(
    previous: ComparedPrefix, sent: Body | None, done: Finalized
) -> tuple[bool | None, int | None, BodyBase | None]:
    """The meter and storage base of a call whose predecessor is known by its compared prefix
    only. (None, None, None) when this call holds no compared messages (nothing to compare, as
    compare_prefix says), or when it does not hold all of the previous ones: the caller then
    reads the previous body."""
    if done.hashes is None or not extends_compared(sent, done.mark, previous):
        return None, None, None
    assert previous.size is not None
    base = BodyBase(previous.record_id, previous.size) if done.layout is not None else None
    return True, previous.messages, base


def _last_calls(store: SQLiteStore, conversation_ids: list[str], bodies: bool) -> dict[str, _Stored]:
    """Store worker: each conversation's last recorded call, as its compared prefix when it has
    one (unless ``bodies``), else as its id and request body."""
    out: dict[str, _Stored] = {}
    for conversation_id in conversation_ids:
        try:
            if not bodies:
                prefix = store.last_llm_call_prefix(conversation_id)
                if prefix is None:
                    continue
                if prefix.sha256 is not None:
                    out[conversation_id] = prefix
                    continue
            last = store.last_llm_call(conversation_id)
        except StoreError:
            log.exception("call log: cannot read the last call of %s", conversation_id)
            last = None
        if last is not None and last.id is not None:
            out[conversation_id] = (last.id, last.request_body)
    return out
