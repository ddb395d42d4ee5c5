"""Anthropic Messages streams, sans-IO: response bytes in, ``ModelEvent`` lists out.

A turn with thinking, redacted thinking or blocks we do not model saves its whole block
sequence as ``ReplayState``, for ``anthropic_request`` to send back block for block.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import attrs

from byok.model.events import (
    Done,
    ModelEvent,
    ProviderError,
    Started,
    TextDelta,
    ThinkingDelta,
    ThinkingEnded,
    ToolCallArgsDelta,
    ToolCallEnded,
    ToolCallStarted,
    UsageReported,
)
from byok.model.messages import ReplayState, canonical_json
from byok.model.usage import Usage
from byok.providers.kinds import ANTHROPIC
from byok.providers.sse import SSEEvent, SSEStreamParser

# In-stream error types a fresh attempt may not hit again, with their HTTP equivalents.
_RETRYABLE_ERRORS = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429}
_FAILING_STOPS = {
    "max_tokens": "response cut off at the output token limit (stop_reason=max_tokens)",
    "refusal": "the model refused to answer (stop_reason=refusal)",
    # Only server-side tools pause a turn; we never send any, and resuming one is a feature
    # of its own, so a paused turn is reported rather than half-answered.
    "pause_turn": "server paused the turn (stop_reason=pause_turn)",
}


@attrs.define
class _Block:
    type: str
    start: dict[str, Any]  # the content_block of content_block_start
    parts: list[str] = attrs.Factory(list)  # text, thinking text or partial JSON
    signature: list[str] = attrs.Factory(list)
    call_index: int = -1
    arguments: str = ""  # tool_use: the complete input JSON text, set at content_block_stop
    thought: bool = False  # a ThinkingDelta was emitted for this block
    closed: bool = False


class AnthropicStreamParser(SSEStreamParser):
    """Feed raw response bytes; get ``ModelEvent`` lists back; call ``end`` at EOF.

    Usage and the stop reason are checked at ``message_stop`` before any ``ToolCallEnded``
    is emitted, so a consumer never sees a "complete" call from a stream that then fails.
    ``ping`` and event types added later are ignored.
    """

    label = "Anthropic"

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._usage: dict[str, Any] = {}
        self._stop_reason: str | None = None
        self._blocks: dict[int, _Block] = {}
        self._calls: list[_Block] = []
        self._done = False

    def end(self) -> list[ModelEvent]:
        out = self._drain_end()
        if not self._done:
            cut = " mid-event" if self._sse.has_partial else ""
            raise ProviderError(f"stream ended{cut} before message_stop (truncated response)")
        return out

    def _handle(self, ev: SSEEvent, out: list[ModelEvent]) -> None:
        if self._done:
            return
        try:
            obj = json.loads(ev.data)
        except ValueError as e:
            raise ProviderError(f"invalid JSON in stream: {e}: {ev.data[:200]!r}") from e
        if not isinstance(obj, dict):
            raise ProviderError(f"unexpected stream event: {ev.data[:200]!r}")
        kind = obj.get("type", ev.event)
        if kind == "error":
            raise _error_event(obj)
        if kind == "message_start":
            message = obj.get("message") or {}
            self._overlay_usage(message.get("usage"))
            if not self._started:
                self._started = True
                out.append(Started())
            return
        if kind == "ping" or kind not in _MESSAGE_EVENTS:
            return
        if not self._started:
            raise ProviderError(f"{kind} before message_start")
        if kind == "content_block_start":
            self._block_start(obj, out)
        elif kind == "content_block_delta":
            self._block_delta(obj, out)
        elif kind == "content_block_stop":
            self._block_stop(obj, out)
        elif kind == "message_delta":
            stop = (obj.get("delta") or {}).get("stop_reason")
            if stop is not None:
                self._stop_reason = stop
            self._overlay_usage(obj.get("usage"))  # cumulative: the last report wins
        else:
            self._message_stop(out)

    def _block_start(self, obj: dict[str, Any], out: list[ModelEvent]) -> None:
        index, start = obj.get("index"), obj.get("content_block")
        if (
            not isinstance(index, int)
            or not isinstance(start, dict)
            or not isinstance(start.get("type"), str)
        ):
            raise ProviderError(f"malformed content_block_start: {obj!r}"[:300])
        if index in self._blocks:
            raise ProviderError(f"content block {index} started twice")
        block = self._blocks[index] = _Block(start["type"], start)
        if block.type == "tool_use":
            call_id, name = start.get("id"), start.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise ProviderError(f"tool_use block without an id and name: {start!r}"[:300])
            block.call_index = len(self._calls)
            self._calls.append(block)
            out.append(ToolCallStarted(block.call_index, call_id, name))
        elif block.type == "text":
            self._text(block, start.get("text"), out)
        elif block.type == "thinking":
            self._thinking(block, start.get("thinking"), out)
            if isinstance(start.get("signature"), str):
                block.signature.append(start["signature"])

    def _block_delta(self, obj: dict[str, Any], out: list[ModelEvent]) -> None:
        block = self._open_block(obj)
        delta = obj.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta" and block.type == "text":
            self._text(block, delta.get("text"), out)
        elif kind == "thinking_delta" and block.type == "thinking":
            self._thinking(block, delta.get("thinking"), out)
        elif kind == "signature_delta" and block.type == "thinking":
            block.signature.append(delta.get("signature") or "")
        elif kind == "input_json_delta":
            part = delta.get("partial_json")
            if isinstance(part, str) and part:
                block.parts.append(part)
                if block.type == "tool_use":
                    out.append(ToolCallArgsDelta(block.call_index, part))
        # citations_delta and delta types added later carry nothing we send or show.

    def _block_stop(self, obj: dict[str, Any], out: list[ModelEvent]) -> None:
        block = self._open_block(obj)
        block.closed = True
        if block.type == "thinking" and block.thought:
            out.append(ThinkingEnded())
        elif block.type == "tool_use" or (block.parts and block.type not in ("text", "thinking")):
            # Server tools stream their input the same way; it is replayed, so it must parse.
            block.arguments = "".join(block.parts) or "{}"  # no input deltas means no arguments
            try:
                value = json.loads(block.arguments)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise ProviderError(f"{block.type} input is not a JSON object: {block.arguments[:200]!r}")

    def _message_stop(self, out: list[ModelEvent]) -> None:
        unclosed = sorted(i for i, b in self._blocks.items() if not b.closed)
        if unclosed:
            raise ProviderError(f"message_stop with content block {unclosed[0]} still open")
        stop = self._stop_reason
        if stop in _FAILING_STOPS:
            raise ProviderError(_FAILING_STOPS[stop], output_limit=stop == "max_tokens")
        if stop not in ("end_turn", "stop_sequence", "tool_use"):
            raise ProviderError(f"unexpected stop_reason={stop!r}")
        if stop == "tool_use" and not self._calls:
            raise ProviderError("stop_reason=tool_use without any tool_use block")
        usage = _parse_usage(self._usage)
        for block in self._calls:
            out.append(ToolCallEnded(block.call_index, block.arguments))
        out.append(UsageReported(usage))
        # Streamed calls decide, as for Chat: "end_turn" after complete calls still has calls to run.
        reason: Literal["stop", "tool_use"] = "tool_use" if self._calls else "stop"
        out.append(Done(reason, self._replay()))
        self._done = True

    def _replay(self) -> ReplayState | None:
        blocks = [self._blocks[i] for i in sorted(self._blocks)]
        if all(b.type in ("text", "tool_use") for b in blocks):
            return None  # text and calls alone rebuild exactly from the assistant turn
        saved: list[dict[str, Any]] = []
        for b in blocks:
            if b.type == "thinking":
                saved.append(
                    {"type": "thinking", "thinking": "".join(b.parts), "signature": "".join(b.signature)}
                )
            elif b.type == "redacted_thinking":
                saved.append({"type": "redacted_thinking", "data": b.start.get("data", "")})
            elif b.type == "text":
                saved.append({"type": "text", "text": "".join(b.parts)})
            elif b.type == "tool_use":
                saved.append({"type": "tool_use", "id": b.start["id"], "name": b.start["name"]})
            else:
                raw = dict(b.start)
                if b.parts:
                    raw["input"] = json.loads(b.arguments)
                saved.append({"type": b.type, "block": raw})
        return ReplayState(ANTHROPIC, canonical_json({"blocks": saved}).decode())

    def _open_block(self, obj: dict[str, Any]) -> _Block:
        index = obj.get("index")
        block = self._blocks.get(index) if isinstance(index, int) else None
        if block is None or block.closed:
            raise ProviderError(f"{obj.get('type')} for content block {obj.get('index')!r} that is not open")
        return block

    def _text(self, block: _Block, text: Any, out: list[ModelEvent]) -> None:
        if isinstance(text, str) and text:
            block.parts.append(text)
            out.append(TextDelta(text))

    def _thinking(self, block: _Block, text: Any, out: list[ModelEvent]) -> None:
        if isinstance(text, str) and text:  # empty thinking deltas do occur
            block.parts.append(text)
            block.thought = True
            out.append(ThinkingDelta(text))

    def _overlay_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self._usage.update({k: v for k, v in usage.items() if v is not None})


_MESSAGE_EVENTS = frozenset(
    {"content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
)


def _parse_usage(u: dict[str, Any]) -> Usage:
    uncached, output = u.get("input_tokens"), u.get("output_tokens")
    if not isinstance(uncached, int) or not isinstance(output, int):
        raise ProviderError(f"usage without token counts: {u!r}"[:300])
    read, written = u.get("cache_read_input_tokens"), u.get("cache_creation_input_tokens")
    read = read if isinstance(read, int) else None
    written = written if isinstance(written, int) else None
    thinking = (u.get("output_tokens_details") or {}).get("thinking_tokens")
    return Usage(
        # input_tokens excludes cached reads and writes; we report the total (CLARIFICATIONS §6).
        input_tokens=uncached + (read or 0) + (written or 0),
        output_tokens=output,
        cache_read_tokens=read,
        cache_write_tokens=written,
        reasoning_tokens=thinking if isinstance(thinking, int) else None,
    )


def _error_event(obj: dict[str, Any]) -> ProviderError:
    err = obj.get("error") if isinstance(obj.get("error"), dict) else {}
    kind = err.get("type") if isinstance(err.get("type"), str) else "error"
    message = err.get("message") or json.dumps(obj)[:300]
    status = _RETRYABLE_ERRORS.get(kind)
    return ProviderError(
        f"provider error in stream: {kind}: {message}", status=status, retryable=status is not None
    )
