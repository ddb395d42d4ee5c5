"""AsyncStore: SQLiteStore for trio code.

sqlite3 blocks, so every call runs in a worker thread. A CapacityLimiter(1) owned by the store
lets exactly one call touch the connection at a time, which both serializes writes through the one
connection and makes ``check_same_thread=False`` safe.

Cancellation: ``trio.to_thread.run_sync`` is not abandoned on cancel, so a cancelled caller still
waits for its statement to finish. A write therefore either commits or rolls back before the
cancellation is delivered, and the limiter is never released while the connection is busy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import trio

from byok.model.messages import Message
from byok.model.usage import Usage
from byok.store.records import BlobEdge, Head, LlmCallRecord, RunRecord, RunStatus
from byok.store.rendered_prefixes import StoredRender
from byok.store.sqlite_store import SQLiteStore

P = ParamSpec("P")
T = TypeVar("T")


class AsyncStore:
    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._limiter = trio.CapacityLimiter(1)

    @classmethod
    async def open(cls, data_dir: Path, *, cache_bytes: int | None = None) -> AsyncStore:
        """Open (creating if needed) ``<data_dir>/byok.sqlite3``; a data dir it creates is mode 0700.
        ``cache_bytes``: the most its decoded histories may hold together."""
        opened = functools.partial(SQLiteStore.open_in, data_dir, cache_bytes=cache_bytes)
        return cls(await trio.to_thread.run_sync(opened))

    @property
    def path(self) -> Path:
        return self._store.path

    def wal_bytes(self) -> int:
        """The WAL file's size (a stat, on the calling thread: it does not touch the connection)."""
        return self._store.wal_bytes()

    def cached_bytes_of(self, conversation_id: str) -> int:
        """Bytes of ``conversation_id``'s decoded history in the store's cache (on the calling
        thread: two dict reads)."""
        return self._store.cached_bytes_of(conversation_id)

    async def call(
        self, fn: Callable[Concatenate[SQLiteStore, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(sqlite_store, *args, **kwargs)`` on the store's worker, one call at a time.
        The typed methods below are this with a SQLiteStore method; use it directly for anything else."""
        job = functools.partial(fn, self._store, *args, **kwargs)
        return await trio.to_thread.run_sync(job, limiter=self._limiter)

    async def aclose(self) -> None:
        await self.call(SQLiteStore.close)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # Conversations.

    async def head(self, conversation_id: str) -> Head:
        return await self.call(SQLiteStore.head, conversation_id)

    async def messages_at(self, revision_id: int) -> tuple[Message, ...]:
        return await self.call(SQLiteStore.messages_at, revision_id)

    async def append(
        self,
        conversation_id: str,
        expected_version: int,
        messages: Sequence[Message],
        now_ms: int,
        *,
        event_id: str | None = None,
        input_id: str | None = None,
        rebase: bool = False,
        durable: bool = True,
    ) -> Head:
        return await self.call(
            SQLiteStore.append,
            conversation_id,
            expected_version,
            tuple(messages),  # the caller may mutate a list while the worker reads it
            now_ms,
            event_id=event_id,
            input_id=input_id,
            rebase=rebase,
            durable=durable,
        )

    async def move_head(
        self, conversation_id: str, expected_version: int, revision_id: int | None, now_ms: int
    ) -> Head:
        return await self.call(SQLiteStore.move_head, conversation_id, expected_version, revision_id, now_ms)

    async def ancestor_with_count(self, revision_id: int | None, count: int) -> int | None:
        return await self.call(SQLiteStore.ancestor_with_count, revision_id, count)

    async def revisions_with_count(self, conversation_id: str, count: int) -> list[tuple[int, Message]]:
        return await self.call(SQLiteStore.revisions_with_count, conversation_id, count)

    async def turns_at(self, revision_id: int | None) -> tuple[bytes, ...]:
        return await self.call(SQLiteStore.turns_at, revision_id)

    async def save_turns(
        self, conversation_id: str, revision_id: int | None, turns: tuple[bytes, ...]
    ) -> None:
        await self.call(SQLiteStore.save_turns, conversation_id, revision_id, turns)

    async def interrupt_running_runs(self, now_ms: int) -> int:
        return await self.call(SQLiteStore.interrupt_running_runs, now_ms)

    async def runtime_event_message(self, conversation_id: str, event_id: str) -> Message | None:
        return await self.call(SQLiteStore.runtime_event_message, conversation_id, event_id)

    async def input_anchor(self, conversation_id: str, input_id: str) -> tuple[bool, int | None]:
        return await self.call(SQLiteStore.input_anchor, conversation_id, input_id)

    # Runs and provider calls.

    async def start_run(self, request_id: str, conversation_id: str, model_id: str, now_ms: int) -> None:
        await self.call(SQLiteStore.start_run, request_id, conversation_id, model_id, now_ms)

    async def finish_run(
        self,
        request_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        error_code: str | None = None,
        error_message: str | None = None,
        usage: Usage | None = None,
        root_ids: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        await self.call(
            SQLiteStore.finish_run,
            request_id,
            status,
            now_ms,
            error_code=error_code,
            error_message=error_message,
            usage=usage,
            root_ids=root_ids,
        )

    async def root_ids_at(self, revision_id: int | None) -> dict[bytes, bytes]:
        return await self.call(SQLiteStore.root_ids_at, revision_id)

    async def rendered_prefix(self, conversation_id: str, render_key: bytes) -> StoredRender | None:
        return await self.call(SQLiteStore.rendered_prefix, conversation_id, render_key)

    async def save_rendered_prefix(
        self,
        conversation_id: str,
        render_key: bytes,
        message_count: int,
        messages_sha256: bytes,
        texts: Sequence[bytes],
    ) -> bool:
        return await self.call(
            SQLiteStore.save_rendered_prefix,
            conversation_id,
            render_key,
            message_count,
            messages_sha256,
            texts,
        )

    async def run(self, request_id: str) -> RunRecord | None:
        return await self.call(SQLiteStore.run, request_id)

    async def record_llm_call(self, rec: LlmCallRecord) -> int:
        return await self.call(SQLiteStore.record_llm_call, rec)

    async def record_llm_calls(self, records: Sequence[LlmCallRecord]) -> list[int]:
        return await self.call(SQLiteStore.record_llm_calls, tuple(records))

    async def llm_calls(self, request_id: str) -> list[LlmCallRecord]:
        return await self.call(SQLiteStore.llm_calls, request_id)

    async def last_llm_call(self, conversation_id: str) -> LlmCallRecord | None:
        return await self.call(SQLiteStore.last_llm_call, conversation_id)

    async def prefix_stats(self, conversation_id: str | None = None) -> tuple[int, int]:
        return await self.call(SQLiteStore.prefix_stats, conversation_id)

    # Blobs.

    async def put_blobs(
        self, blobs: Sequence[tuple[bytes, bytes]], now_ms: int, edges: Sequence[BlobEdge] = ()
    ) -> None:
        await self.call(SQLiteStore.put_blobs, tuple(blobs), now_ms, tuple(edges))

    async def get_blob(self, blob_id: bytes) -> bytes | None:
        return await self.call(SQLiteStore.get_blob, blob_id)

    async def has_blobs(self, ids: Iterable[bytes]) -> set[bytes]:
        return await self.call(SQLiteStore.has_blobs, tuple(ids))
