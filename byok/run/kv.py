"""Blob SET/ACK with the client's KV store (seeds 000 §6, §20).

Each SET gets its own KV id; the client answers with set_blob_result for that id. A
checkpoint may only reference blobs whose SET was acknowledged, so publishing waits here.
"""

from __future__ import annotations

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
        self._failed: dict[int, str] = {}
        # Blob ids the client is known to hold (shared across runs of a conversation).
        self.acked = acked

    async def put(self, blobs: Iterable[Blob], timeout_s: float) -> int:
        """SET every blob the client does not hold yet and wait for all ACKs. Returns how many."""
        events: list[tuple[int, bytes, trio.Event]] = []
        for blob in blobs:
            if blob.id in self.acked:
                continue
            kv_id = self._next_id
            self._next_id += 1
            done = trio.Event()
            self._waiting[kv_id] = (blob.id, done)
            events.append((kv_id, blob.id, done))
            self._send(encode.set_blob(kv_id, blob.id, blob.data))
        if not events:
            return 0
        with trio.move_on_after(timeout_s) as scope:
            for _, _, done in events:
                await done.wait()
        if scope.cancelled_caught:
            missing = sum(1 for _, _, d in events if not d.is_set())
            for kv_id, _, _ in events:
                self._waiting.pop(kv_id, None)
            raise KvFailure(f"client did not acknowledge {missing} blob SET(s) within {timeout_s:g}s")
        errors = [self._failed.pop(kv_id) for kv_id, _, _ in events if kv_id in self._failed]
        if errors:
            raise KvFailure(f"client rejected a blob SET: {errors[0]}")
        return len(events)

    def on_client(self, msg: agent.KvClientMessage) -> bool:
        """Route one kv_client_message; False when it answers nothing we wait for (late or unknown)."""
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
