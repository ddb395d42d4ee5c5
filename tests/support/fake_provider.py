"""A real HTTP/1.1 server on 127.0.0.1 that plays scripted provider responses.

h11 over trio sockets, one task per connection, keep-alive supported (httpx pools). Each
script chunk is written (and, with TCP_NODELAY, sent) separately as its own HTTP chunk, so
tests observe incremental delivery the way a real streaming provider produces it.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs
import h11
import trio

SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))


@attrs.define
class Script:
    status: int = 200
    headers: list[tuple[str, str]] = attrs.Factory(lambda: list(SSE_HEADERS))
    chunks: list[bytes] = attrs.Factory(list)
    delay_s: float = 0.0  # sleep between chunks
    hang_before_headers: bool = False
    close_after: int | None = None  # abort the connection after N chunks, mid-body


@attrs.frozen
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    json: Any  # parsed body, or None when it is not JSON


class FakeProvider:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Script] = deque()

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await nursery.start(partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def enqueue(self, *scripts: Script) -> None:
        self._queue.extend(scripts)

    async def _serve(self, stream: trio.SocketStream) -> None:
        # A handler exception would crash the whole server, so client hang-ups end quietly.
        try:
            await self._connection(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request = await self._read_request(conn, stream)
            if request is None:
                return
            script = self._queue.popleft() if self._queue else _no_script()
            if not await self._respond(conn, stream, script):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _read_request(self, conn: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)  # b"" marks EOF; h11 then reports ConnectionClosed
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                self.requests.append(_record(request, bytes(body)))
                return request

    async def _respond(self, conn: h11.Connection, stream: trio.SocketStream, script: Script) -> bool:
        """Play one script; False when the connection must not be reused."""
        if script.hang_before_headers:
            await trio.sleep_forever()
        headers = [*script.headers, ("transfer-encoding", "chunked")]
        await stream.send_all(conn.send(h11.Response(status_code=script.status, headers=headers)))
        for i, chunk in enumerate(script.chunks):
            if script.close_after is not None and i >= script.close_after:
                return False  # _serve closes the socket with the chunked body unfinished
            if i and script.delay_s:
                await trio.sleep(script.delay_s)
            await stream.send_all(conn.send(h11.Data(data=chunk)))
        if script.close_after is not None:
            return False
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True


def _record(request: h11.Request, body: bytes) -> RecordedRequest:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return RecordedRequest(
        method=request.method.decode(),
        path=request.target.decode(),
        headers={k.decode().lower(): v.decode() for k, v in request.headers},
        body=body,
        json=parsed,
    )


def _no_script() -> Script:
    return error_script(500, "FakeProvider: no script enqueued for this request")


# --- script builders -----------------------------------------------------------------------


def sse(obj: Any) -> bytes:
    """One SSE event carrying ``obj`` as JSON (or a raw string such as "[DONE]")."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def error_script(status: int, message: str, *, retry_after: str | None = None) -> Script:
    headers = [("content-type", "application/json")]
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    body = json.dumps({"error": {"message": message, "type": "fake_error", "code": status}})
    return Script(status=status, headers=headers, chunks=[body.encode()])


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    choices = (
        [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake-model",
        "choices": choices,
        "usage": usage,
    }


def _usage(usage: tuple[int, int], reasoning_tokens: int | None = None) -> dict[str, Any]:
    prompt, completion = usage
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def _finish(chunks: list[bytes], finish: str, usage: tuple[int, int], done: bool) -> None:
    # OpenAI style: an empty finish chunk, then a choices:[] chunk carrying usage, then [DONE].
    chunks.append(sse(_chunk({}, finish)))
    chunks.append(sse(_chunk(None, usage=_usage(usage))))
    if done:
        chunks.append(sse("[DONE]"))


def chat_text_script(
    texts: Sequence[str],
    *,
    reasoning: Sequence[str] = (),
    usage: tuple[int, int] = (10, 5),
    finish: str = "stop",
    done: bool = True,
    delay_s: float = 0.0,
    close_after: int | None = None,
) -> Script:
    """A realistic Chat Completions stream: role chunk, reasoning_content, content, finish,
    usage, [DONE]; one SSE event per HTTP chunk."""
    chunks = [sse(_chunk({"role": "assistant", "content": ""}))]
    chunks += [sse(_chunk({"content": None, "reasoning_content": r})) for r in reasoning]
    chunks += [sse(_chunk({"content": t})) for t in texts]
    _finish(chunks, finish, usage, done)
    return Script(chunks=chunks, delay_s=delay_s, close_after=close_after)


def chat_tool_script(
    calls: Sequence[tuple[str, str, str]],
    *,
    text: str = "",
    usage: tuple[int, int] = (10, 5),
    finish: str = "tool_calls",
    done: bool = True,
    delay_s: float = 0.0,
) -> Script:
    """Tool calls as OpenAI streams them: per index a start fragment (id, name, arguments
    "") then the arguments in two fragments; ``calls`` are (call_id, name, args_json)."""
    chunks = [sse(_chunk({"role": "assistant", "content": text or None}))]
    for index, (call_id, name, args) in enumerate(calls):
        start = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        chunks.append(sse(_chunk({"tool_calls": [start]})))
        half = len(args) // 2
        for part in (args[:half], args[half:]):
            if part:
                chunks.append(
                    sse(_chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
                )
    _finish(chunks, finish, usage, done)
    return Script(chunks=chunks, delay_s=delay_s)
