"""Blob SET/ACK with the client's KV store (seeds 000 §6, §20).

Each SET gets its own KV id; the client answers with set_blob_result for that id. A
checkpoint may only reference blobs whose SET was acknowledged, so publishing waits here.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Iterator

import trio

from byok.cursor import encode
from byok.cursor.checkpoint import Blob
from byok.cursor.client_messages import KvAnswer


class KvFailure(Exception):
    pass


class KvLink:
    def __init__(self, send: Callable[[bytes], None], acked: set[bytes], *, first_id: int = 0) -> None:
        self._send = send
        self._next_id = first_id
        self._waiting: dict[int, bytes] = {}  # kv id -> blob id, until the SET's answer
        self._sent: dict[int, bytes] = {}  # kv id -> the SET frame, until its answer
        self._pending: dict[bytes, trio.Event] = {}  # blob id -> set when its SET is answered
        self._rejected: dict[bytes, str] = {}  # blob id -> why the client refused its last SET
        self._gets: dict[int, tuple[trio.Event, list[bytes | None]]] = {}
        self._get_frames: dict[int, bytes] = {}  # kv id -> the GET frame, until its answer
        # The waits under way, each with its timeout: a new RunSSE restarts them (resend_unacked).
        self._waits: dict[trio.CancelScope, float] = {}
        # Blob ids the client is known to hold (shared across runs of a conversation).
        self.acked = acked

    @property
    def next_id(self) -> int:
        return self._next_id

    def offer(self, blobs: Iterable[Blob]) -> int:
        """SET, without waiting, every blob the client does not hold and that is not on its way
        already: a result's blobs go out as it is committed, so the checkpoint that needs them
        later waits for ACKs already in flight. Returns how many SETs were sent."""
        sent = 0
        for blob in blobs:
            if blob.id in self.acked or blob.id in self._pending:
                continue
            kv_id = self._next_id
            self._next_id += 1
            self._pending[blob.id] = trio.Event()
            self._rejected.pop(blob.id, None)
            self._waiting[kv_id] = blob.id
            frame = self._sent[kv_id] = encode.set_blob(kv_id, blob.id, blob.data)
            self._send(frame)
            sent += 1
        return sent

    async def put(self, blobs: Iterable[Blob], timeout_s: float) -> int:
        """SET every blob the client does not hold yet and wait until the client holds all of
        them (SETs offered earlier included). Returns how many SETs this call sent."""
        blobs = list(blobs)
        sent = self.offer(blobs)
        await self.settle(blobs, timeout_s)
        return sent

    async def settle(self, blobs: Iterable[Blob], timeout_s: float) -> None:
        """Wait, sending nothing, until the client answered the SETs of ``blobs`` already offered;
        raises KvFailure when one was refused or the answers took longer than ``timeout_s``."""
        ids = [b.id for b in blobs]
        waits = {i: self._pending[i] for i in ids if i in self._pending}
        with self._deadline(timeout_s) as scope:
            for done in waits.values():
                await done.wait()
        if scope.cancelled_caught:
            missing = sum(1 for d in waits.values() if not d.is_set())
            raise KvFailure(f"client did not acknowledge {missing} blob SET(s) within {timeout_s:g}s")
        errors = [self._rejected[i] for i in ids if i in self._rejected and i not in self.acked]
        if errors:
            raise KvFailure(f"client rejected a blob SET: {errors[0]}")

    async def get(self, blob_id: bytes, timeout_s: float, expected_len: int | None = None) -> bytes:
        """Read a blob the client owns. The bytes are verified as received: SHA-256 of the raw
        bytes must be the id, and the length must match when the reference gave one."""
        kv_id = self._next_id
        self._next_id += 1
        done = trio.Event()
        holder: list[bytes | None] = []
        self._gets[kv_id] = (done, holder)
        frame = self._get_frames[kv_id] = encode.get_blob(kv_id, blob_id)
        self._send(frame)
        with self._deadline(timeout_s):
            await done.wait()
        self._gets.pop(kv_id, None)
        self._get_frames.pop(kv_id, None)
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

    @contextlib.contextmanager
    def _deadline(self, timeout_s: float) -> Iterator[trio.CancelScope]:
        with trio.move_on_after(timeout_s) as scope:
            self._waits[scope] = timeout_s
            try:
                yield scope
            finally:
                del self._waits[scope]

    def resend_unacked(self) -> int:
        """A new RunSSE replaced one that died: SETs and GETs written to the dead connection may
        never have arrived. Both are idempotent, so every unanswered one is sent again (same KV
        id), and each wait for an answer starts its timeout again: the time without a stream,
        which the reconnect grace bounds, is not the client's to answer in."""
        for frame in (*self._sent.values(), *self._get_frames.values()):
            self._send(frame)
        for scope, timeout_s in self._waits.items():
            scope.deadline = max(scope.deadline, trio.current_time() + timeout_s)
        return len(self._sent) + len(self._get_frames)

    def on_client(self, answer: KvAnswer) -> bool:
        """Route one KV answer; False when it answers nothing we wait for (late or unknown)."""
        got = self._gets.pop(answer.kv_id, None)
        if got is not None:
            done, holder = got
            holder.append(answer.get_data)
            done.set()
            return True
        blob_id = self._waiting.pop(answer.kv_id, None)
        if blob_id is None:
            return False
        self._sent.pop(answer.kv_id, None)
        if not answer.set_result:
            self._rejected[blob_id] = "answer to a SET was not a set_blob_result"
        elif answer.set_error is not None:
            self._rejected[blob_id] = answer.set_error
        else:
            self.acked.add(blob_id)
        done = self._pending.pop(blob_id, None)
        if done is not None:
            done.set()
        return True
