"""The live stream of provider calls: each record, as the call log writes it, goes to every
open subscriber (the console's event stream). A subscriber that falls behind loses calls, never
slows the writer: its queue is bounded and a full queue drops and counts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import trio

from byok.store.console_queries import record_json
from byok.store.records import LlmCallRecord

SUBSCRIBER_BUFFER = 256
MAX_SUBSCRIBERS = 32


class TooManySubscribers(Exception):
    pass


class FeedClosed(Exception):
    """The daemon is shutting down: no new subscribers."""


class CallFeed:
    def __init__(self) -> None:
        self._subscribers: dict[trio.MemorySendChannel[dict[str, Any]], int] = {}
        self.dropped = 0
        self.closed = False

    def close(self) -> None:
        """End every subscriber's stream (shutdown: an endless response would hold the server)."""
        self.closed = True
        for channel in self._subscribers:
            channel.close()

    def publish(self, records: list[LlmCallRecord]) -> None:
        if not self._subscribers:
            return
        items = [record_json(r) for r in records]
        for channel in self._subscribers:
            for item in items:
                try:
                    channel.send_nowait(item)
                except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    self.dropped += 1

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[trio.MemoryReceiveChannel[dict[str, Any]]]:
        if self.closed:
            raise FeedClosed
        if len(self._subscribers) >= MAX_SUBSCRIBERS:
            raise TooManySubscribers(f"at most {MAX_SUBSCRIBERS} live streams at once")
        send, receive = trio.open_memory_channel[dict[str, Any]](SUBSCRIBER_BUFFER)
        self._subscribers[send] = 0
        try:
            yield receive
        finally:
            del self._subscribers[send]
            send.close()
            receive.close()
