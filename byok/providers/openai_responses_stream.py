"""OpenAI Responses streams, sans-IO: response bytes in, ``ModelEvent`` lists out.

Every output item of a completed response is saved, in order, as the turn's ``ReplayState``,
for ``openai_responses_request`` to send back on later requests.
"""

from __future__ import annotations

import json
from typing import Any

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
from byok.providers.kinds import OPENAI_RESPONSES
from byok.providers.sse import SSEEvent, SSEStreamParser

# Error codes of in-stream failures that a fresh attempt may not hit again.
_RETRYABLE_CODES = frozenset({"server_error", "rate_limit_exceeded", "server_is_overloaded", "slow_down"})


@attrs.define
class _Item:
    type: str
    raw: dict[str, Any]  # the item as last seen: output_item.added, then output_item.done
    text: list[str] = attrs.Factory(list)  # message text, or function-call argument deltas
    call_index: int = -1
    call_id: str = ""
    name: str = ""
    arguments: str | None = None  # complete arguments, from arguments.done or output_item.done


class ResponsesStreamParser(SSEStreamParser):
    """Feed raw response bytes; get ``ModelEvent`` lists back; call ``end`` at EOF.

    Events this parser does not name (``content_part.*``, ``output_text.done``,
    ``reasoning_summary_part.done``, annotations...) repeat what the deltas and
    ``output_item.done`` already carry, so they are ignored, as are event types added later.
    """

    label = "Responses"

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._items: dict[int, _Item] = {}  # by output_index
        self._ids: dict[str, int] = {}  # item id -> output_index
        self._calls: list[_Item] = []
        self._thinking_open = False
        self._done = False

    def end(self) -> list[ModelEvent]:
        out = self._drain_end()
        if not self._done:
            cut = " mid-event" if self._sse.has_partial else ""
            raise ProviderError(f"stream ended{cut} before response.completed (truncated response)")
        return out

    def _handle(self, ev: SSEEvent, out: list[ModelEvent]) -> None:
        if self._done:
            return  # OpenRouter appends "data: [DONE]"; nothing after completion matters
        if ev.data == "[DONE]":
            raise ProviderError("stream ended with [DONE] before response.completed")
        try:
            obj = json.loads(ev.data)
        except ValueError as e:
            raise ProviderError(f"invalid JSON in stream: {e}: {ev.data[:200]!r}") from e
        if not isinstance(obj, dict):
            raise ProviderError(f"unexpected stream event: {ev.data[:200]!r}")
        kind = obj.get("type", ev.event)
        if kind == "error":
            raise _error_event(obj)
        if kind == "response.failed":
            raise _failed(obj.get("response"))
        if kind == "response.incomplete":
            details = (obj.get("response") or {}).get("incomplete_details") or {}
            reason = details.get("reason") or "unknown"
            raise ProviderError(
                f"response incomplete: {reason} (the answer was cut off)",
                output_limit=reason == "max_output_tokens",
            )
        if not self._started:
            self._started = True
            out.append(Started())
        if kind == "response.output_item.added":
            self._added(obj, out)
        elif kind == "response.output_item.done":
            self._item_done(obj, out)
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            self._text(obj, out)  # a refusal is text the user should see
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            self._thinking(obj.get("delta"), out)
        elif kind == "response.reasoning_summary_part.added" and obj.get("summary_index", 0) > 0:
            self._thinking("\n\n", out)  # summary parts are paragraphs; keep them apart on screen
        elif kind == "response.function_call_arguments.delta":
            self._args(obj, out)
        elif kind == "response.function_call_arguments.done":
            item = self._item_of(obj)
            if item is not None and isinstance(obj.get("arguments"), str):
                item.arguments = obj["arguments"]
        elif kind == "response.completed":
            self._completed(obj.get("response"), out)

    def _added(self, obj: dict[str, Any], out: list[ModelEvent]) -> _Item:
        raw = obj.get("item")
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise ProviderError(f"output item without a type: {obj!r}"[:300])
        index = obj.get("output_index")
        if not isinstance(index, int):
            index = len(self._items)
        item = self._items[index] = _Item(raw["type"], raw)
        if isinstance(raw.get("id"), str):
            self._ids[raw["id"]] = index
        if item.type != "reasoning":
            self._end_thinking(out)
        if item.type == "function_call":
            call_id, name = raw.get("call_id"), raw.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise ProviderError(f"function call without a call_id and name: {raw!r}"[:300])
            item.call_index, item.call_id, item.name = len(self._calls), call_id, name
            self._calls.append(item)
            out.append(ToolCallStarted(item.call_index, call_id, name))
            self._add_args(item, raw.get("arguments"), out)
        return item

    def _item_done(self, obj: dict[str, Any], out: list[ModelEvent]) -> None:
        item = self._item_of(obj)
        if item is None:
            item = self._added(obj, out)  # a server that skipped output_item.added
        raw = obj.get("item")
        if isinstance(raw, dict):
            item.raw = raw  # encrypted_content may change between added and done
        if item.type == "reasoning":
            self._end_thinking(out)
        elif item.type == "function_call":
            if not item.text:
                self._add_args(item, item.raw.get("arguments"), out)
            if isinstance(item.raw.get("arguments"), str):
                item.arguments = item.raw["arguments"]
        elif item.type == "message" and not item.text:
            # Text that arrived only whole is still text the turn said.
            parts = item.raw.get("content") if isinstance(item.raw.get("content"), list) else []
            text = "".join(p.get("text") or p.get("refusal") or "" for p in parts if isinstance(p, dict))
            if text:
                item.text.append(text)
                out.append(TextDelta(text))

    def _text(self, obj: dict[str, Any], out: list[ModelEvent]) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, str) or not delta:
            return
        item = self._item_of(obj)
        if item is None:
            raise ProviderError(f"text for an output item never added: {obj!r}"[:300])
        self._end_thinking(out)
        item.text.append(delta)
        out.append(TextDelta(delta))

    def _args(self, obj: dict[str, Any], out: list[ModelEvent]) -> None:
        item = self._item_of(obj)
        if item is None or item.type != "function_call":
            raise ProviderError(f"arguments for a function call never added: {obj!r}"[:300])
        self._add_args(item, obj.get("delta"), out)

    def _add_args(self, item: _Item, delta: Any, out: list[ModelEvent]) -> None:
        if isinstance(delta, str) and delta:
            item.text.append(delta)
            out.append(ToolCallArgsDelta(item.call_index, delta))

    def _thinking(self, delta: Any, out: list[ModelEvent]) -> None:
        if isinstance(delta, str) and delta:
            self._thinking_open = True
            out.append(ThinkingDelta(delta))

    def _end_thinking(self, out: list[ModelEvent]) -> None:
        if self._thinking_open:
            self._thinking_open = False
            out.append(ThinkingEnded())

    def _item_of(self, obj: dict[str, Any]) -> _Item | None:
        index = obj.get("output_index")
        if not isinstance(index, int):
            index = self._ids.get(obj.get("item_id") or (obj.get("item") or {}).get("id") or "", -1)
        return self._items.get(index)

    def _completed(self, response: Any, out: list[ModelEvent]) -> None:
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            raise ProviderError("response.completed without usage")  # we never estimate tokens
        parsed = _parse_usage(usage)
        self._end_thinking(out)
        for item in self._calls:
            arguments = item.arguments if item.arguments is not None else "".join(item.text)
            item.arguments = arguments
            out.append(ToolCallEnded(item.call_index, arguments))
        out.append(UsageReported(parsed))
        items = [self._replay_item(self._items[i]) for i in sorted(self._items)]
        replay = ReplayState(OPENAI_RESPONSES, canonical_json({"items": items}).decode()) if items else None
        out.append(Done("tool_use" if self._calls else "stop", replay))
        self._done = True

    def _replay_item(self, item: _Item) -> dict[str, Any]:
        raw = item.raw
        if item.type == "reasoning":
            saved: dict[str, Any] = {"type": "reasoning", "id": raw.get("id", ""), "summary": []}
            # content: raw reasoning text, from open-weight servers only.
            saved.update(
                {k: raw[k] for k in ("summary", "content") if isinstance(raw.get(k), list) and raw[k]}
            )
            if isinstance(raw.get("encrypted_content"), str):
                saved["encrypted_content"] = raw["encrypted_content"]
            return saved
        if item.type == "message":
            saved = {"type": "message", "id": raw.get("id", ""), "text": "".join(item.text)}
            if isinstance(raw.get("phase"), str):
                saved["phase"] = raw["phase"]
            return saved
        if item.type == "function_call":
            return {
                "type": "function_call",
                "id": raw.get("id", ""),
                "call_id": item.call_id,
                "name": item.name,
                "arguments": item.arguments,
            }
        return {"type": item.type, "item": raw}


def _parse_usage(u: dict[str, Any]) -> Usage:
    prompt, completion = u.get("input_tokens"), u.get("output_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        raise ProviderError(f"usage without token counts: {u!r}"[:300])
    details = u.get("input_tokens_details") or {}
    cached, written = details.get("cached_tokens"), details.get("cache_write_tokens")
    reasoning = (u.get("output_tokens_details") or {}).get("reasoning_tokens")
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        cache_read_tokens=cached if isinstance(cached, int) else None,
        cache_write_tokens=written if isinstance(written, int) else None,
        reasoning_tokens=reasoning if isinstance(reasoning, int) else None,
    )


def _error_event(obj: dict[str, Any]) -> ProviderError:
    # Current streams nest the error; older ones put code/message on the event itself.
    err = obj.get("error") if isinstance(obj.get("error"), dict) else obj
    code = err.get("code") or err.get("type")
    code = code if isinstance(code, str) else None
    message = err.get("message") or json.dumps(obj)[:300]
    return ProviderError(
        f"provider error in stream: {message}" + (f" ({code})" if code else ""),
        retryable=code in _RETRYABLE_CODES,
    )


def _failed(response: Any) -> ProviderError:
    err = response.get("error") if isinstance(response, dict) else None
    if not isinstance(err, dict):
        return ProviderError("response failed without an error")
    code = err.get("code") if isinstance(err.get("code"), str) else None
    return ProviderError(
        f"response failed: {err.get('message') or 'no message'}" + (f" ({code})" if code else ""),
        retryable=code in _RETRYABLE_CODES,
    )
