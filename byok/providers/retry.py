"""Retrying a provider call, only while a retry cannot be seen.

A retry is invisible when the failed attempt showed the client nothing: its only event may
have been ``Started``, which is held back until a second event (or the end of the stream)
proves the attempt real. Once any output was delivered, a failure is final: sending the
answer again from the start would duplicate text and tool calls the client already has.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import trio

from byok.model.body import Body
from byok.model.events import ModelEvent, ProviderError, Started
from byok.providers.http_errors import RETRYABLE_4XX
from byok.providers.runner import CallStats, Endpoint, StreamParser, stream_call

# Longer server-requested pauses are cut to this: a turn silent for longer looks hung.
MAX_RETRY_AFTER_S = 60.0

OnAttempt = Callable[[int, CallStats, ProviderError | None], Awaitable[None]]


async def stream_with_retries(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    body: Body,
    new_parser: Callable[[], StreamParser],
    on_events: Callable[[list[ModelEvent]], Awaitable[None]],
    *,
    max_tries: int = 4,
    base_delay_s: float = 0.5,
    max_delay_s: float = 8.0,
    on_attempt: OnAttempt | None = None,
    capture: bytearray | None = None,
) -> CallStats:
    """``stream_call`` with up to ``max_tries`` attempts, every one sending ``body`` as is.

    ``on_attempt(attempt, stats, error)`` runs after each finished attempt (``attempt``
    counts from 1; ``error`` is None for the successful one), so every provider call can be
    recorded. A cancelled attempt is not reported: the canceller owns that outcome. Returns
    the successful attempt's stats; raises the last attempt's ProviderError.

    ``capture``: cleared at the start of every attempt and passed to ``stream_call``, so it
    ends up holding the last attempt's raw response bytes (capped).
    """
    attempt = 0
    while True:
        attempt += 1
        stats = CallStats()
        gate = _HoldStarted(on_events)
        if capture is not None:
            capture.clear()
        try:
            await stream_call(client, endpoint, body, new_parser(), gate, stats=stats, capture=capture)
        except ProviderError as e:
            if on_attempt is not None:
                await on_attempt(attempt, stats, e)
            if gate.delivered or attempt >= max_tries or not _retryable(e):
                raise
            await trio.sleep(_delay(e, attempt, base_delay_s, max_delay_s))
            continue
        await gate.flush()
        if on_attempt is not None:
            await on_attempt(attempt, stats, None)
        return stats


class _HoldStarted:
    """Passes events through, except that a leading run of ``Started`` waits for company."""

    def __init__(self, on_events: Callable[[list[ModelEvent]], Awaitable[None]]) -> None:
        self._on_events = on_events
        self._held: list[ModelEvent] = []
        self.delivered = False

    async def __call__(self, events: list[ModelEvent]) -> None:
        if not self.delivered:
            events = self._held + events
            if all(isinstance(e, Started) for e in events):
                self._held = events
                return
            self._held = []
            self.delivered = True
        await self._on_events(events)

    async def flush(self) -> None:
        if self._held:
            held, self._held = self._held, []
            self.delivered = True
            await self._on_events(held)


def _retryable(e: ProviderError) -> bool:
    # The status check is belt and braces: a client error other than these is our request's
    # fault, and sending the same bytes again cannot fix it.
    if e.status is not None and 400 <= e.status <= 499 and e.status not in RETRYABLE_4XX:
        return False
    return e.retryable


def _delay(e: ProviderError, attempt: int, base_s: float, max_s: float) -> float:
    if e.retry_after_s is not None:
        return min(e.retry_after_s, MAX_RETRY_AFTER_S)
    # Deterministic exponential backoff: base, 2*base, 4*base... (no jitter, so tests and
    # call records are reproducible; one daemon per user has no thundering herd to spread).
    return min(base_s * 2 ** (attempt - 1), max_s)
