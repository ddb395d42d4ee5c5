"""Blob SET/ACK with the client's KV store (seeds 000 §6, §20).

Each SET gets its own KV id; the client answers with set_blob_result for that id. A
checkpoint may only reference blobs whose SET was acknowledged, so publishing waits here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import trio

from byok.cursor import encode
from byok.cursor.checkpoint import Blob
from byok.pb.agent import v1 as agent


class KvFailure(Exception):
    pass


class KvLink:
    def __init__(self, send: Callable[[bytes], None], acked: set[bytes]) -> None:
        self._send = send
        self._next_id = 0
        self._waiting: dict[int, tuple[bytes, trio.Event]] = {}
        self._sent: dict[int, bytes] = {}  # kv id -> the SET frame, until its ACK
        self._failed: dict[int, str] = {}
        self._gets: dict[int, tuple[trio.Event, list[bytes | None]]] = {}
        self._in_flight: set[bytes] = set()  # SET sent, ACK pending: never SET twice
        # Blob ids the client is known to hold (shared across runs of a conversation).
        self.acked = acked

    async def put(self, blobs: Iterable[Blob], timeout_s: float) -> int:
        """SET every blob the client does not hold yet and wait for all ACKs. Returns how many."""
        events: list[tuple[int, bytes, trio.Event]] = []
        for blob in blobs:
            if blob.id in self.acked or blob.id in self._in_flight:
                continue
            self._in_flight.add(blob.id)
            kv_id = self._next_id
            self._next_id += 1
            done = trio.Event()
            self._waiting[kv_id] = (blob.id, done)
            events.append((kv_id, blob.id, done))
            frame = self._sent[kv_id] = encode.set_blob(kv_id, blob.id, blob.data)
            self._send(frame)
        if not events:
            return 0
        try:
            with trio.move_on_after(timeout_s) as scope:
                for _, _, done in events:
                    await done.wait()
        finally:
            for kv_id, blob_id, _ in events:
                self._in_flight.discard(blob_id)
                self._sent.pop(kv_id, None)
        if scope.cancelled_caught:
            missing = sum(1 for _, _, d in events if not d.is_set())
            for kv_id, _, _ in events:
                self._waiting.pop(kv_id, None)
            raise KvFailure(f"client did not acknowledge {missing} blob SET(s) within {timeout_s:g}s")
        errors = [self._failed.pop(kv_id) for kv_id, _, _ in events if kv_id in self._failed]
        if errors:
            raise KvFailure(f"client rejected a blob SET: {errors[0]}")
        return len(events)

    async def get(self, blob_id: bytes, timeout_s: float, expected_len: int | None = None) -> bytes:
        """Read a blob the client owns. The bytes are verified as received: SHA-256 of the raw
        bytes must be the id, and the length must match when the reference gave one."""
        kv_id = self._next_id
        self._next_id += 1
        done = trio.Event()
        holder: list[bytes | None] = []
        self._gets[kv_id] = (done, holder)
        self._send(encode.get_blob(kv_id, blob_id))
        with trio.move_on_after(timeout_s):
            await done.wait()
        self._gets.pop(kv_id, None)
        if not done.is_set():
            raise KvFailure(f"client did not answer the GET of blob {blob_id.hex()} within {timeout_s:g}s")
        data = holder[0] if holder else None
        if not data:
            raise KvFailure(f"client has no blob {blob_id.hex()}")
        if hashlib.sha256(data).digest() != blob_id:
            raise KvFailure(f"blob {blob_id.hex()} failed its SHA-256 check")
        if expected_len is not None and len(data) != expected_len:
            raise KvFailure(f"blob {blob_id.hex()} is {len(data)} bytes, expected {expected_len}")
        self.acked.add(blob_id)
        return data

    def resend_unacked(self) -> int:
        """A new RunSSE replaced one that died: SETs written to the dead connection may never have
        arrived. Blob SETs are idempotent, so every unacknowledged one is sent again (same KV id)."""
        for frame in self._sent.values():
            self._send(frame)
        return len(self._sent)

    def on_client(self, msg: agent.KvClientMessage) -> bool:
        """Route one kv_client_message; False when it answers nothing we wait for (late or unknown)."""
        got = self._gets.pop(msg.id, None)
        if got is not None:
            done, holder = got
            result = msg.get_blob_result
            holder.append(result.blob_data if result is not None else None)
            done.set()
            return True
        entry = self._waiting.pop(msg.id, None)
        if entry is None:
            return False
        blob_id, done = entry
        result = msg.set_blob_result
        if result is None:
            self._failed[msg.id] = "answer to a SET was not a set_blob_result"
        elif result.error is not None:
            self._failed[msg.id] = result.error.message or "unspecified error"
        else:
            self.acked.add(blob_id)
        done.set()
        return True
