"""A real HTTP/1.1 server on 127.0.0.1 that plays scripted provider responses.

h11 over trio sockets, one task per connection, keep-alive supported (httpx pools). Each
script chunk is written (and, with TCP_NODELAY, sent) separately as its own HTTP chunk, so
tests observe incremental delivery the way a real streaming provider produces it.
"""

from __future__ import annotations

import functools
import json
import time
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
    at: float = 0.0  # time.monotonic() when the request arrived (ordering against client frames)

    @functools.cached_property
    def json(self) -> Any:
        """The parsed body, or None when it is not JSON. Parsed when first asked for, not as the
        request arrives: the provider shares its process with the simulated client, and a
        real provider's parse costs the client nothing (a 2.2 MB body took ~10 ms)."""
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None


class FakeProvider:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.connections = 0  # TCP connections accepted
        self._open = 0
        self._queue: deque[Script] = deque()
        self._idle: set[trio.CancelScope] = set()  # connections waiting for their next request
        # Answered to GET .../models (model discovery) without taking a script, when set.
        self.models: list[dict[str, Any]] | None = None

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await nursery.start(partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def enqueue(self, *scripts: Script) -> None:
        self._queue.extend(scripts)

    def drop_unused(self) -> None:
        """Forget the scripts no request has taken yet."""
        self._queue.clear()

    async def close_idle(self) -> None:
        """Close every kept-alive connection once it waits for its next request, as a server's
        idle timeout does; returns when they are closed."""
        while len(self._idle) < self._open:
            await trio.sleep(0)
        for scope in self._idle:
            scope.cancel()
        while self._open:
            await trio.sleep(0)

    async def _serve(self, stream: trio.SocketStream) -> None:
        # A handler exception would crash the whole server, so client hang-ups end quietly.
        self.connections += 1
        self._open += 1
        try:
            await self._connection(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)
            self._open -= 1

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request: h11.Request | None = None
            with trio.CancelScope() as idle:
                self._idle.add(idle)
                try:
                    request = await self._read_request(conn, stream)
                finally:
                    self._idle.discard(idle)
            if idle.cancelled_caught or request is None:
                return
            if (
                self.models is not None
                and request.method == b"GET"
                and request.target.split(b"?")[0].endswith(b"/models")
            ):
                script = Script(
                    headers=[("content-type", "application/json")],
                    chunks=[json.dumps({"data": self.models}).encode()],
                )
            else:
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
    return RecordedRequest(
        method=request.method.decode(),
        path=request.target.decode(),
        headers={k.decode().lower(): v.decode() for k, v in request.headers},
        body=body,
        at=time.monotonic(),
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


# --- OpenAI Responses and Anthropic scripts ------------------------------------------------


def named_sse(obj: dict[str, Any]) -> bytes:
    """One SSE event with an ``event:`` line equal to its JSON type, as Responses and
    Anthropic send them."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def invalid_json_script() -> Script:
    """A 200 event stream whose second event is not JSON."""
    return Script(chunks=[named_sse({"type": "response.created", "response": {}}), b"data: {not json\n\n"])


def _responses_events(
    items: list[tuple[str, dict[str, Any], list[dict[str, Any]]]], usage: tuple[int, int]
) -> list[bytes]:
    response = {"id": "resp_fake", "object": "response", "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
    ]
    for index, (_, item, deltas) in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item["added"]})
        events += [{**d, "output_index": index, "item_id": item["added"]["id"]} for d in deltas]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item["done"]})
    prompt, completion = usage
    done = {
        **response,
        "status": "completed",
        "output": [item["done"] for _, item, _ in items],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }
    events.append({"type": "response.completed", "response": done})
    return [named_sse({**e, "sequence_number": n}) for n, e in enumerate(events)]


def _responses_reasoning(summary: Sequence[str], encrypted: str | None) -> tuple[str, Any, Any]:
    added: dict[str, Any] = {"id": "rs_fake", "type": "reasoning", "summary": []}
    done = {**added, "summary": [{"type": "summary_text", "text": s} for s in summary]}
    if encrypted is not None:
        added["encrypted_content"] = done["encrypted_content"] = encrypted
    deltas = [
        {"type": "response.reasoning_summary_text.delta", "summary_index": i, "delta": s}
        for i, s in enumerate(summary)
    ]
    return ("reasoning", {"added": added, "done": done}, deltas)


def _responses_message(texts: Sequence[str]) -> tuple[str, Any, Any]:
    added = {"id": "msg_fake", "type": "message", "status": "in_progress", "content": [], "role": "assistant"}
    part = {"type": "output_text", "annotations": [], "text": "".join(texts)}
    done = {**added, "status": "completed", "content": [part]}
    deltas = [{"type": "response.output_text.delta", "content_index": 0, "delta": t} for t in texts]
    return ("message", {"added": added, "done": done}, deltas)


def responses_text_script(
    texts: Sequence[str],
    *,
    reasoning: Sequence[str] = (),
    encrypted: str | None = None,
    usage: tuple[int, int] = (10, 5),
    delay_s: float = 0.0,
    close_after: int | None = None,
) -> Script:
    """A Responses stream: created, in_progress, an optional reasoning item (summary parts,
    encrypted content), one message item, completed with usage."""
    items = [_responses_reasoning(reasoning, encrypted)] if reasoning or encrypted else []
    items.append(_responses_message(texts))
    return Script(chunks=_responses_events(items, usage), delay_s=delay_s, close_after=close_after)


def responses_tool_script(
    calls: Sequence[tuple[str, str, str]],
    *,
    text: str = "",
    reasoning: Sequence[str] = (),
    encrypted: str | None = None,
    usage: tuple[int, int] = (10, 5),
    delay_s: float = 0.0,
) -> Script:
    """Function calls as Responses streams them; ``calls`` are (call_id, name, args_json)."""
    items = [_responses_reasoning(reasoning, encrypted)] if reasoning or encrypted else []
    if text:
        items.append(_responses_message([text]))
    for n, (call_id, name, args) in enumerate(calls):
        added = {"id": f"fc_fake{n}", "type": "function_call", "status": "in_progress", "arguments": "",
                 "call_id": call_id, "name": name}  # fmt: skip
        half = len(args) // 2
        deltas: list[dict[str, Any]] = [
            {"type": "response.function_call_arguments.delta", "delta": part}
            for part in (args[:half], args[half:])
            if part
        ]
        deltas.append({"type": "response.function_call_arguments.done", "arguments": args})
        items.append(("function_call", {"added": added, "done": {**added, "status": "completed",
                                                                  "arguments": args}}, deltas))  # fmt: skip
    return Script(chunks=_responses_events(items, usage), delay_s=delay_s)


def _anthropic_events(
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]], stop_reason: str, usage: tuple[int, int]
) -> list[bytes]:
    prompt, completion = usage
    start_usage = {"input_tokens": prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                   "output_tokens": 1}  # fmt: skip
    message = {"id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-model", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": start_usage}  # fmt: skip
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}, {"type": "ping"}]
    for index, (start, deltas) in enumerate(blocks):
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {**start_usage, "output_tokens": completion},
        }
    )
    events.append({"type": "message_stop"})
    return [named_sse(e) for e in events]


def _anthropic_thinking(thinking: Sequence[str], signature: str | None) -> list[Any]:
    if not thinking and signature is None:
        return []
    deltas: list[dict[str, Any]] = [{"type": "thinking_delta", "thinking": t} for t in thinking]
    deltas.append({"type": "signature_delta", "signature": signature or ""})
    return [({"type": "thinking", "thinking": "", "signature": ""}, deltas)]


def anthropic_text_script(
    texts: Sequence[str],
    *,
    thinking: Sequence[str] = (),
    signature: str | None = None,
    usage: tuple[int, int] = (10, 5),
    stop_reason: str = "end_turn",
    delay_s: float = 0.0,
    close_after: int | None = None,
) -> Script:
    """An Anthropic Messages stream: message_start, ping, an optional thinking block (deltas,
    then one signature_delta), one text block, message_delta, message_stop."""
    blocks = _anthropic_thinking(thinking, signature)
    blocks.append(({"type": "text", "text": ""}, [{"type": "text_delta", "text": t} for t in texts]))
    return Script(
        chunks=_anthropic_events(blocks, stop_reason, usage), delay_s=delay_s, close_after=close_after
    )


def anthropic_tool_script(
    calls: Sequence[tuple[str, str, str]],
    *,
    text: str = "",
    thinking: Sequence[str] = (),
    signature: str | None = None,
    usage: tuple[int, int] = (10, 5),
    delay_s: float = 0.0,
) -> Script:
    """tool_use blocks as Anthropic streams them (an empty partial_json first, then the input
    in two parts); ``calls`` are (tool_use_id, name, input_json)."""
    blocks = _anthropic_thinking(thinking, signature)
    if text:
        blocks.append(({"type": "text", "text": ""}, [{"type": "text_delta", "text": text}]))
    for call_id, name, args in calls:
        half = len(args) // 2
        parts = [""] + [p for p in (args[:half], args[half:]) if p]
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in parts]
        blocks.append(({"type": "tool_use", "id": call_id, "name": name, "input": {}}, deltas))
    return Script(chunks=_anthropic_events(blocks, "tool_use", usage), delay_s=delay_s)
