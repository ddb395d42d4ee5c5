"""Provider-call records, written off the run's path in batches, and the prefix meter.

A run hands each finished provider call to ``CallLog.submit`` (never blocks, never touches
SQLite); one writer task owned by the daemon finalizes everything queued on a worker thread of
its own, then writes it in one transaction per batch (the store's one worker does only the
INSERT). The writer also fills in the prefix meter: does this call's message list extend the
previous call's (same conversation) message for message? Messages are compared as serialized
bytes: each element of the request's message array (Chat: ``messages``; Responses:
``instructions`` as element 0, then ``input``; Anthropic: ``system`` as element 0, then
``messages``) is hashed as its JSON text exactly as sent, so a changed system prompt counts as
a broken prefix. The adapters hand over those texts with the body (``RenderedRequest``), and
each text's hash is memoised, so a call costs what its new messages cost, not the whole body.
The previous call's per-message hashes live in a bounded LRU keyed by conversation; a
conversation not in it (after a restart or eviction) is compared with its last recorded call in
SQLite, whose stored body gives the same hashes (each element's exact span). A stored body
that was redacted no longer holds what was sent: the call after it is not compared (None).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence

import attrs
import httpx
import trio

from byok.loop.model_call import ModelProtocolError
from byok.model.events import ProviderError
from byok.model.usage import Usage
from byok.providers.fragment_cache import SizedLru
from byok.providers.rendering import split_body
from byok.run.body_chain import BodyLayout, layout_of, shared_bytes
from byok.run.redaction import REDACTED, may_hold_secret, redact_body
from byok.store import AsyncStore, BodyBase, LlmCallRecord, SQLiteStore, StoreError

log = logging.getLogger("byok.call_log")

# Conversations whose last call's message hashes are kept in memory.
MAX_CONVERSATIONS = 256
# Records waiting for the writer; beyond this (SQLite stalled for long) new ones are dropped.
MAX_PENDING = 1024
# On shutdown the writer stops starting writes after this long.
DRAIN_TIMEOUT_S = 10.0


# --- pure helpers -----------------------------------------------------------------------------


# Element bytes -> (their SHA-256, whether they may hold a secret key). Keyed by the adapters'
# cached texts, so a long conversation hashes only its new messages. The finalize threads of
# several CallLogs may share it.
ELEMENT_DIGESTS: SizedLru[tuple[bytes, bool]] = SizedLru(24 * 2**20)
_DIGESTS_LOCK = threading.Lock()


def element_digests(elements: Sequence[bytes], memo: bool = True) -> tuple[tuple[bytes, ...], bool]:
    """Each element's SHA-256 (of its JSON bytes as sent), and whether any may hold a secret.
    ``memo=False`` for elements cut from a body: caching them would pin a copy of the history."""
    if not memo:
        digests = tuple(hashlib.sha256(e).digest() for e in elements)
        return digests, any(may_hold_secret(e) for e in elements)
    out: list[bytes] = []
    secret = False
    with _DIGESTS_LOCK:
        for text in elements:
            hit = ELEMENT_DIGESTS.get(text)
            if hit is None:
                hit = (hashlib.sha256(text).digest(), may_hold_secret(text))
                ELEMENT_DIGESTS.put(text, hit, len(text) + 150)
            out.append(hit[0])
            secret = secret or hit[1]
    return tuple(out), secret


def message_hashes(body: bytes | None) -> tuple[bytes, ...] | None:
    """SHA-256 of each compared element's JSON text as it appears in ``body``; None when
    unknown (no body, not JSON, no message array)."""
    split = None if body is None else split_body(body)
    if split is None or split.elements is None:
        return None
    # Not memoised: cut from a body, they would pin a copy of the history.
    return tuple(hashlib.sha256(e).digest() for e in split.elements)


_REDACTED_JSON = b'"' + REDACTED.encode() + b'"'


def stored_message_hashes(body: bytes | None) -> tuple[bytes, ...] | None:
    """message_hashes of a stored request body; None (unknown) when it was redacted, since its
    elements may then differ from what was sent, which is what the meter compares."""
    if body is None or _REDACTED_JSON in body:
        return None
    return message_hashes(body)


def compare_prefix(
    previous: Sequence[bytes] | None, current: Sequence[bytes] | None
) -> tuple[bool | None, int | None]:
    """(prefix_extends, common_prefix_messages): whether ``current`` starts with all of
    ``previous``, and how many leading messages they share. (None, None) for a first call or
    when either side is unknown."""
    if previous is None or current is None:
        return None, None
    common = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        common += 1
    return common == len(previous), common


def cache_hit_share(usage: Usage | None) -> float | None:
    """cache_read / input. byok's input_tokens already includes cached reads and writes
    (Anthropic: input + cache_read + cache_creation), so it is the denominator as is. None
    when the provider reported no cache counts."""
    if usage is None or (usage.cache_read_tokens is None and usage.cache_write_tokens is None):
        return None
    if usage.input_tokens <= 0:
        return None
    return (usage.cache_read_tokens or 0) / usage.input_tokens


def error_kind(exc: BaseException | None, http_status: int | None = None) -> str | None:
    """Classify how a provider call failed: http_4xx, http_5xx (http_Nxx for other statuses),
    rate_limited, connection, stream_error, protocol, canceled, internal. ``http_status`` is the
    response status of the attempt the call ended with, if it got one."""
    if exc is None:
        return None
    if isinstance(exc, trio.Cancelled):
        return "canceled"
    if isinstance(exc, ProviderError):
        status = http_status
        if status is None and exc.message.startswith("HTTP "):
            status = exc.status
        if status is not None and not 200 <= status < 300:
            return "rate_limited" if status == 429 else f"http_{status // 100}xx"
        if isinstance(exc.__cause__, httpx.RequestError):
            return "connection"
        if exc.message.startswith(("provider error in stream", "response failed")):
            return "rate_limited" if exc.status == 429 else "stream_error"
        return "protocol"  # truncated stream, bad JSON, JSON instead of a stream, cut off...
    if isinstance(exc, ModelProtocolError):
        return "protocol"
    return "internal"


# --- the writer -------------------------------------------------------------------------------


def finalize_and_hash(rec: LlmCallRecord) -> tuple[LlmCallRecord, tuple[bytes, ...] | None]:
    """Fill in what is derived from the request body (the model name, the hashes of what was
    really sent, the redacted body that is stored) and return the prefix meter's hashes of the
    sent elements beside it. With the render the body
    came from, nothing is parsed: the elements' hashes are memoised, the two whole-body hashes
    run without the GIL, and only a body that may hold a secret key is parsed for redaction.
    Without one (a body from elsewhere) the body is walked once for its elements."""
    rec, hashes, _ = _finalize(rec)
    return rec, hashes


def _finalize(rec: LlmCallRecord) -> tuple[LlmCallRecord, tuple[bytes, ...] | None, BodyLayout | None]:
    """finalize_and_hash, plus the stored body's layout when a later call may store its own
    body as a tail of this one (not when redaction changed what is stored)."""
    if rec.request_sha256 or rec.request_body is None:
        return attrs.evolve(rec, rendered=None), message_hashes(rec.request_body), None
    body = rec.request_body
    shape = rec.rendered
    ours = shape is not None and shape.body is body
    if not ours:
        shape = split_body(body)
    hashes: tuple[bytes, ...] | None = None
    secret = True
    messages_sha256 = hashlib.sha256(b"[]")  # no message array
    if shape is not None and shape.elements is not None and shape.array is not None:
        hashes, secret = element_digests(shape.elements, memo=ours)
        start, end = shape.array
        view = memoryview(body)
        if not secret:  # the elements are checked; the rest of the body is small
            secret = may_hold_secret(bytes(view[:start]) + bytes(view[end:]))
        messages_sha256 = hashlib.sha256(view[start:end])
    stored = redact_body(body) if secret else body
    rec = attrs.evolve(
        rec,
        model=rec.model or (shape.model if shape is not None else ""),
        request_body=stored,
        request_sha256=hashlib.sha256(body).hexdigest(),
        messages_sha256=messages_sha256.hexdigest(),
        rendered=None,
    )
    layout = None
    if stored is body and shape is not None and hashes is not None:
        layout = layout_of(body, shape, hashes)
    return rec, hashes, layout


def _stored_last(body: bytes | None) -> tuple[tuple[bytes, ...] | None, BodyLayout | None]:
    """The meter's hashes and the layout of a stored body (a conversation's last call, read
    after a restart); nothing for a redacted body, which may differ from what was sent."""
    if body is None or _REDACTED_JSON in body:
        return None, None
    shape = split_body(body)
    if shape is None or shape.elements is None:
        return None, None
    # Not memoised: cut from a body, they would pin a copy of the history.
    digests = tuple(hashlib.sha256(e).digest() for e in shape.elements)
    return digests, layout_of(body, shape, digests)


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
    ) -> None:
        self.store = store
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
                records, remember = await trio.to_thread.run_sync(self._finalize_batch, batch, stored)
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
            for conversation_id, (index, last) in remember.items():
                # A row that was not written cannot be a later body's base.
                row = ids[index] if ids else None
                kept = attrs.evolve(last, record_id=row) if row is not None else _Last(last.hashes)
                self._remember(conversation_id, kept)
            self._processed += len(batch)
            self._wake()

    async def _stored_previous(self, batch: list[LlmCallRecord]) -> dict[str, tuple[int, bytes | None]]:
        """The last recorded call (id, request body) of each conversation of ``batch`` that is
        not in memory (after a restart or eviction). Bodies only: walking them is the finalize
        thread's job."""
        missing = {r.conversation_id for r in batch if r.conversation_id not in self._previous}
        if not missing:
            return {}
        return await self.store.call(_last_calls, sorted(missing))

    def _finalize_batch(
        self, batch: list[LlmCallRecord], stored: dict[str, tuple[int, bytes | None]]
    ) -> tuple[list[LlmCallRecord], dict[str, tuple[int, _Last]]]:
        """Finalize thread: each record's derived fields, prefix meter and storage base, and what
        to remember of each conversation's last record (by its index in the batch) once written.
        Reads ``_previous`` only: the writer's lock keeps it still."""
        records = []
        # This batch's own earlier calls are not in SQLite yet, and the LRU may have evicted them.
        in_batch: dict[str, tuple[int, _Last]] = {}
        for index, rec in enumerate(batch):
            rec, current, layout = _finalize(rec)
            conversation_id = rec.conversation_id
            if conversation_id in in_batch:
                last = in_batch[conversation_id][1]  # no row id yet: not a base
            elif conversation_id in self._previous:
                last = self._previous[conversation_id]
            elif conversation_id in stored:
                row_id, body = stored[conversation_id]
                hashes, stored_layout = _stored_last(body)
                last = _Last(hashes, row_id, stored_layout)
            else:
                last = _Last(None)
            extends, common = compare_prefix(last.hashes, current)
            base = None
            if last.record_id is not None and last.layout is not None and layout is not None:
                shared = shared_bytes(last.layout, layout)
                base = BodyBase(last.record_id, shared) if shared else None
            records.append(
                attrs.evolve(rec, prefix_extends=extends, common_prefix_messages=common, body_base=base)
            )
            in_batch[conversation_id] = (index, _Last(current, None, layout))
        return records, in_batch

    def _remember(self, conversation_id: str, last: _Last) -> None:
        if last.hashes is None:
            # Unknown messages: the next call falls back to SQLite, which knows no better.
            self._previous.pop(conversation_id, None)
            return
        self._previous[conversation_id] = last
        self._previous.move_to_end(conversation_id)
        while len(self._previous) > self._max_conversations:
            self._previous.popitem(last=False)


def _last_calls(store: SQLiteStore, conversation_ids: list[str]) -> dict[str, tuple[int, bytes | None]]:
    """Store worker: the id and request body of each conversation's last recorded call."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for conversation_id in conversation_ids:
        try:
            last = store.last_llm_call(conversation_id)
        except StoreError:
            log.exception("call log: cannot read the last call of %s", conversation_id)
            last = None
        if last is not None and last.id is not None:
            out[conversation_id] = (last.id, last.request_body)
    return out
