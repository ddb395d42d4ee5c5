"""The thin I/O shell around a sans-IO provider parser: one streamed POST, no retries.

Cancellation is structural: the caller's trio cancel scope around ``stream_call`` covers
connecting, waiting for response headers and reading the body alike.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import attrs
import httpx
import trio

from byok.model import body as spliced
from byok.model.body import Body
from byok.model.events import (
    ModelEvent,
    ProviderError,
    TextDelta,
    ThinkingDelta,
    ToolCallArgsDelta,
    ToolCallStarted,
)
from byok.providers.http_errors import http_error
from byok.providers.secrets import redact_bytes, redact_error

_MAX_ERROR_BODY = 64 * 1024
# Cap on ``stream_call(capture=...)``: a detailed call record keeps at most this much of a response.
MAX_CAPTURE_BYTES = 8 * 1024 * 1024
# Events that mean the model produced output (what time-to-first-token measures).
_OUTPUT_EVENTS = (TextDelta, ThinkingDelta, ToolCallStarted, ToolCallArgsDelta)


class StreamParser(Protocol):
    def feed(self, data: bytes) -> list[ModelEvent]: ...

    def end(self) -> list[ModelEvent]: ...


@attrs.frozen
class Endpoint:
    url: str
    headers: tuple[tuple[str, str], ...]
    # What the provider's text is cleaned of (secrets.provider_secrets: its key, its headers).
    secrets: tuple[str, ...] = attrs.field(default=(), repr=False)


@attrs.define
class CallStats:
    status: int | None = None
    ttfb_s: float | None = None  # request start -> response headers
    ttft_s: float | None = None  # request start -> first output event
    duration_s: float | None = None
    events: int = 0
    bytes: int = 0  # response body bytes, after content decoding


async def stream_call(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    body: Body,
    parser: StreamParser,
    on_events: Callable[[list[ModelEvent]], Awaitable[None]],
    clock: Callable[[], float] = trio.current_time,
    *,
    stats: CallStats | None = None,
    capture: bytearray | None = None,
) -> CallStats:
    """POST ``body`` and stream the response through ``parser`` into ``on_events``.

    Raises ProviderError for non-2xx statuses, transport failures and whatever the parser
    rejects. Pass ``stats`` to have it filled in place, so that a failed or cancelled call
    still reports its status, timings and byte counts. Pass ``capture`` to have the response
    body (after content decoding; error bodies too) appended to it, up to MAX_CAPTURE_BYTES
    in all; ``stats.bytes`` larger than what was captured means the capture was cut.

    What the provider says is cleaned of ``endpoint.secrets`` here, the one way in: every
    ProviderError raised and the capture (a 401 may echo the key it was sent).
    """
    stats = CallStats() if stats is None else stats
    start = clock()
    try:
        await _stream(client, endpoint, body, parser, on_events, clock, stats, capture, start)
    except ProviderError as e:
        redact_error(e, endpoint.secrets)
        raise
    finally:
        stats.duration_s = clock() - start
        if capture and endpoint.secrets:
            capture[:] = redact_bytes(bytes(capture), endpoint.secrets)
    return stats


async def _stream(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    body: Body,
    parser: StreamParser,
    on_events: Callable[[list[ModelEvent]], Awaitable[None]],
    clock: Callable[[], float],
    stats: CallStats,
    capture: bytearray | None,
    start: float,
) -> None:
    try:
        content = _content(body)
        async with client.stream(
            "POST", _url(endpoint.url), content=content, headers=_headers(endpoint, content, len(body))
        ) as resp:
            stats.status = resp.status_code
            stats.ttfb_s = clock() - start
            if not 200 <= resp.status_code < 300:
                error_body = _captured(capture, await _read_capped(resp))
                raise http_error(resp.status_code, error_body, resp.headers.get("retry-after"))
            content_type = resp.headers.get("content-type", "")
            if content_type.startswith("application/json"):
                # A 200 JSON body instead of a stream is some gateways' way to report errors.
                err = http_error(resp.status_code, _captured(capture, await _read_capped(resp)), None)
                raise ProviderError(f"expected an event stream, got JSON: {err.message}", status=200)
            if content_type.startswith("text/html"):
                # A web app's page (a UI on that port, a login portal) answers any path with 200.
                _captured(capture, await _read_capped(resp))
                raise ProviderError(
                    "expected an event stream, got an HTML page: is base_url the API's address?",
                    status=200,
                )
            async for chunk in resp.aiter_bytes():
                stats.bytes += len(chunk)
                _captured(capture, chunk)
                await _deliver(parser.feed(chunk), stats, start, clock, on_events)
            await _deliver(parser.end(), stats, start, clock, on_events)
    except httpx.RequestError as e:
        raise _transport_error(e) from e


def _captured(capture: bytearray | None, data: bytes) -> bytes:
    if capture is not None and len(capture) < MAX_CAPTURE_BYTES:
        capture += data[: MAX_CAPTURE_BYTES - len(capture)]
    return data


@functools.lru_cache(maxsize=64)
def _url(url: str) -> httpx.URL:
    # httpx parses a str URL on every request (~60 us); a parsed one is reused as is.
    return httpx.URL(url)


def _content(body: Body) -> bytes | AsyncIterator[bytes]:
    if isinstance(body, bytes):
        return body
    if len(body) <= spliced.CHUNK_BYTES:
        return bytes(body)  # one write either way; bytes spare httpx an iterator

    async def pieces() -> AsyncIterator[bytes]:
        for chunk in body.whole_chunks():
            yield chunk

    return pieces()  # a new one per attempt: a retry sends the body again


def _headers(
    endpoint: Endpoint, content: bytes | AsyncIterator[bytes], size: int
) -> tuple[tuple[str, str], ...]:
    if isinstance(content, bytes):
        return _fixed_headers(endpoint)
    # httpx frames an iterated body as chunked unless told its length; providers expect one.
    return (*_fixed_headers(endpoint), ("content-length", str(size)))


@functools.lru_cache(maxsize=64)
def _fixed_headers(endpoint: Endpoint) -> tuple[tuple[str, str], ...]:
    headers = list(endpoint.headers)
    present = {k.lower() for k, _ in headers}
    for key, value in (
        ("content-type", "application/json"),
        ("accept", "text/event-stream"),
        # Compressed SSE tends to be buffered by servers and proxies; ask for it plain.
        ("accept-encoding", "identity"),
    ):
        if key not in present:
            headers.append((key, value))
    return tuple(headers)


async def _deliver(
    events: list[ModelEvent],
    stats: CallStats,
    start: float,
    clock: Callable[[], float],
    on_events: Callable[[list[ModelEvent]], Awaitable[None]],
) -> None:
    if not events:
        return
    if stats.ttft_s is None and any(isinstance(e, _OUTPUT_EVENTS) for e in events):
        stats.ttft_s = clock() - start
    stats.events += len(events)
    await on_events(events)


async def _read_capped(resp: httpx.Response) -> bytes:
    # An error body is for a message; never let a misbehaving server make us buffer much.
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        buf += chunk
        if len(buf) >= _MAX_ERROR_BODY:
            break
    return bytes(buf[:_MAX_ERROR_BODY])


def _transport_error(e: httpx.RequestError) -> ProviderError:
    # Connection-level failures may succeed on a retry; a bad URL or our own protocol
    # misuse will not.
    retryable = isinstance(
        e, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError | httpx.ProxyError
    )
    reason = f"{type(e).__name__}: {str(e) or 'connection failed'}"
    if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
        # "Name or service not known" alone does not say which server: name it (scheme, host and
        # port only; a query string may hold a key).
        url = e.request.url
        reason = f"cannot connect to {url.scheme}://{url.netloc.decode()} ({reason})"
    return ProviderError(reason, retryable=retryable)
