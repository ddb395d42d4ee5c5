"""OpenAI Chat Completions streams, sans-IO: response bytes in, ``ModelEvent`` lists out.

Also serves the many "OpenAI-compatible" providers (DeepSeek, Groq, OpenRouter, xAI...):
reasoning arrives as ``delta.reasoning_content`` or ``delta.reasoning``, usage may ride on
the finish chunk, and errors may arrive inside a 200 stream.
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
from byok.providers.http_errors import error_message as _error_message
from byok.providers.http_errors import retryable_status as _retryable_status
from byok.providers.kinds import OPENAI_CHAT
from byok.providers.sse import SSEEvent, SSEStreamParser


@attrs.define
class _Call:
    call_id: str
    name: str
    args: list[str] = attrs.Factory(list)


class ChatStreamParser(SSEStreamParser):
    """Feed raw response bytes; get ``ModelEvent`` lists back; call ``end`` at EOF.

    Validation of the finish reason and usage happens before ``ToolCallEnded`` is emitted,
    so a consumer never sees a "complete" call from a stream that then fails (length limit,
    missing usage, truncation).
    """

    label = "Chat"

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._thinking: list[str] = []
        self._thinking_open = False
        self._calls: dict[int, _Call] = {}
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._done = False

    def end(self) -> list[ModelEvent]:
        out = self._drain_end()
        if self._done:
            return out
        if self._finish is None:
            cut = " mid-event" if self._sse.has_partial else ""
            raise ProviderError(f"stream ended{cut} before finish_reason (truncated response)")
        if self._usage is None:
            raise ProviderError("stream ended before [DONE] and without usage (truncated response)")
        # Some providers stop after the usage chunk without [DONE]; that is a whole answer.
        self._terminal(out)
        return out

    def _handle(self, ev: SSEEvent, out: list[ModelEvent]) -> None:
        if self._done:
            return  # nothing after [DONE] means anything
        if ev.data == "[DONE]":
            self._terminal(out)
            return
        try:
            obj = json.loads(ev.data)
        except ValueError as e:
            raise ProviderError(f"invalid JSON in stream: {e}: {ev.data[:200]!r}") from e
        if not isinstance(obj, dict):
            raise ProviderError(f"unexpected stream chunk: {ev.data[:200]!r}")
        if obj.get("error") is not None or ev.event == "error":
            raise _stream_error(obj)
        if not self._started:
            self._started = True
            out.append(Started())
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._usage = _parse_usage(usage)  # last non-null usage wins
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            self._choice(choices[0], out)

    def _choice(self, choice: dict[str, Any], out: list[ModelEvent]) -> None:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        # OpenRouter's reasoning_details[] duplicates "reasoning", so it is not read.
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            # Reasoning after ThinkingEnded (rare interleaving) is still shown and replayed.
            self._thinking.append(reasoning)
            self._thinking_open = True
            out.append(ThinkingDelta(reasoning))
        for key in ("content", "refusal"):  # a refusal is text the user should see
            text = delta.get(key)
            if isinstance(text, str) and text:
                self._end_thinking(out)
                out.append(TextDelta(text))
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for frag in tool_calls:
                self._tool_fragment(frag, out)
        finish = choice.get("finish_reason")
        if finish is not None:
            self._finish = finish  # providers may repeat it; the last one wins
            self._end_thinking(out)

    def _tool_fragment(self, frag: Any, out: list[ModelEvent]) -> None:
        if not isinstance(frag, dict) or not isinstance(frag.get("index"), int):
            raise ProviderError(f"tool call fragment without an index: {frag!r}"[:300])
        index = frag["index"]
        fn = frag.get("function") or {}
        call = self._calls.get(index)
        if call is None:
            call_id, name = frag.get("id"), fn.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise ProviderError(f"tool call {index} started without an id and name: {frag!r}"[:300])
            self._end_thinking(out)
            call = self._calls[index] = _Call(call_id, name)
            out.append(ToolCallStarted(index, call_id, name))
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            call.args.append(args)
            out.append(ToolCallArgsDelta(index, args))

    def _end_thinking(self, out: list[ModelEvent]) -> None:
        if self._thinking_open:
            self._thinking_open = False
            out.append(ThinkingEnded())

    def _terminal(self, out: list[ModelEvent]) -> None:
        finish = self._finish
        if finish is None:
            raise ProviderError("stream ended before finish_reason")
        if finish == "length":
            raise ProviderError(
                "response cut off at the output token limit (finish_reason=length)", output_limit=True
            )
        if finish == "content_filter":
            raise ProviderError(
                "response blocked by the provider's content filter (finish_reason=content_filter)"
            )
        if finish not in ("stop", "tool_calls"):
            raise ProviderError(f"unexpected finish_reason={finish!r}")
        if self._usage is None:
            # We always send stream_options.include_usage; a stream without usage means the
            # provider ignored it, and we never estimate tokens.
            raise ProviderError("provider reported no usage (stream_options.include_usage ignored?)")
        self._end_thinking(out)
        for index in sorted(self._calls):
            out.append(ToolCallEnded(index, "".join(self._calls[index].args)))
        out.append(UsageReported(self._usage))
        # Streamed calls decide, not the label: some providers finish a tool turn with
        # "stop", and a "tool_calls" finish with no calls has nothing to run.
        reason = "tool_use" if self._calls else "stop"
        replay = None
        if self._thinking:
            data = canonical_json({"reasoning_content": "".join(self._thinking)}).decode()
            replay = ReplayState(OPENAI_CHAT, data)
        out.append(Done(reason, replay))
        self._done = True


def _parse_usage(u: dict[str, Any]) -> Usage:
    prompt = u.get("prompt_tokens")
    completion = u.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        raise ProviderError(f"usage without token counts: {u!r}"[:300])
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    if not isinstance(cached, int):
        cached = u.get("prompt_cache_hit_tokens")  # DeepSeek
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        cache_read_tokens=cached if isinstance(cached, int) else None,
        reasoning_tokens=reasoning if isinstance(reasoning, int) else None,
    )


def _stream_error(obj: dict[str, Any]) -> ProviderError:
    err = obj.get("error")
    status: int | None = None
    if isinstance(err, dict):
        raw = err.get("status_code", err.get("code"))
        status = raw if isinstance(raw, int) else None
    message = _error_message(obj) or json.dumps(obj)[:300]
    return ProviderError(
        f"provider error in stream: {message}", status=status, retryable=_retryable_status(status)
    )
