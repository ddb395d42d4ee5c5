"""Small ASGI helpers: read a capped body, answer unary responses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from byok.http.connect_envelope import ConnectError, http_status_for, unary_error_body

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    def __init__(self, message: str, head: bytes = b"", *, complete: bool = False) -> None:
        super().__init__(message)
        self.head = head  # what was read before the limit was crossed, that chunk included
        self.complete = complete  # that chunk was the body's last: nothing more to receive


class ClientGone(Exception):
    pass


async def body_chunks(receive: Receive) -> AsyncIterator[tuple[bytes, bool]]:
    """The request body as it arrives: (chunk, whether more follows). ClientGone if the
    client leaves first."""
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            raise ClientGone
        more = bool(event.get("more_body", False))
        yield event.get("body", b""), more
        if not more:
            return


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async with aclosing(body_chunks(receive)) as body:  # closed here, even when left early
        async for chunk, more in body:
            size += len(chunk)
            chunks.append(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body exceeds {limit} bytes", b"".join(chunks), complete=not more)
    return b"".join(chunks)


def header(scope: Scope, name: str) -> str | None:
    key = name.lower().encode()
    for k, v in scope.get("headers", ()):
        if k.lower() == key:
            return v.decode("latin-1")
    return None


async def respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connect-protocol-version", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def respond_json(send: Send, status: int, obj: object) -> None:
    await respond(send, status, json.dumps(obj).encode(), "application/json")


async def respond_connect_error(send: Send, err: ConnectError) -> None:
    await respond(send, http_status_for(err.code), unary_error_body(err), "application/json")


def replay_receive(body: bytes, receive: Receive) -> Receive:
    """An ASGI receive that yields an already-read body (to relay it upstream unchanged), then
    defers to the real one, which now only reports the client going away."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
