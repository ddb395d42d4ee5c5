"""One provider call folded into UI emits and, at Done, one assistant message.

Only ``Done`` produces a message (invariant 4): partial deltas are UI only. The caller
passes a monotonic time with each event so thinking duration is measured without a clock.

``CallFold`` is a frozen value (the turn machine keeps it in its state): each ``handle``
returns the next fold and the emits. Text and thinking are kept as chains of chunks, so a
delta costs the same whatever came before it; they are joined once, at ``result``.
"""

from __future__ import annotations

from typing import Literal

import attrs

from byok.loop.emits import (
    Emit,
    TextOut,
    ThinkingDone,
    ThinkingOut,
    TokensOut,
    ToolArgsOut,
    ToolCallOpened,
)
from byok.loop.replace import replace, replacer
from byok.model import events as ev
from byok.model.messages import Message, ReplayState, ToolCall, join_surrogates
from byok.model.usage import Usage


class ModelProtocolError(Exception):
    """The provider's event sequence broke the ModelEvent contract (adapter bug or hostile stream)."""


@attrs.frozen
class ModelCallResult:
    message: Message
    usage: Usage
    reason: Literal["stop", "tool_use"]
    thinking_duration_ms: int


# A chain of text chunks, newest first: (rest, chunk). Appending shares everything before it.
Chunks = tuple["Chunks", str] | None


def _join(chunks: Chunks) -> str:
    parts: list[str] = []
    while chunks is not None:
        chunks, part = chunks
        parts.append(part)
    parts.reverse()
    return "".join(parts)


@attrs.frozen
class OpenCall:
    index: int
    call_id: str
    name: str
    complete: str | None = None  # the arguments ToolCallEnded gave


@attrs.frozen
class CallFold:
    model_call_id: str
    text: Chunks = None
    thinking: Chunks = None
    thinking_first: float | None = None
    thinking_last: float | None = None
    thinking_done: bool = False
    calls: tuple[OpenCall, ...] = ()  # in start order
    usage: Usage | None = None
    done: ev.Done | None = None

    @property
    def thinking_duration_ms(self) -> int:
        if self.thinking_first is None or self.thinking_last is None:
            return 0
        # Cursor shows "thought for 0s" as a broken card; report at least 1 ms.
        return max(1, round((self.thinking_last - self.thinking_first) * 1000))

    def handle(self, event: ev.ModelEvent, now_s: float) -> tuple[CallFold, list[Emit]]:
        if self.done is not None:
            raise ModelProtocolError(f"event after Done: {type(event).__name__}")
        match event:
            case ev.Started():
                return self, []
            case ev.TextDelta(text=text):
                fold, out = self._close_thinking(now_s)
                return replace(fold, text=(fold.text, text)), [*out, TextOut(text)]
            case ev.ThinkingDelta(text=text):
                # A second reasoning phase (interleaved thinking) reopens the card.
                first = now_s if self.thinking_first is None else self.thinking_first
                fold = replace(
                    self,
                    thinking=(self.thinking, text),
                    thinking_first=first,
                    thinking_last=now_s,
                    thinking_done=False,
                )
                return fold, [ThinkingOut(text)]
            case ev.ThinkingEnded():
                return self._close_thinking(now_s)
            case ev.ToolCallStarted(index=index, call_id=call_id, name=name):
                if any(c.index == index for c in self.calls):
                    raise ModelProtocolError(f"tool call index {index} started twice")
                if any(c.call_id == call_id for c in self.calls):
                    # Results are matched to calls by id: a round with two calls of one id
                    # could never complete (its run would wait for the second result forever).
                    raise ModelProtocolError(f"tool call id {call_id!r} used by two calls")
                fold, out = self._close_thinking(now_s)
                fold = replace(fold, calls=(*fold.calls, OpenCall(index, call_id, name)))
                return fold, [*out, ToolCallOpened(call_id, name, self.model_call_id)]
            case ev.ToolCallArgsDelta(index=index, delta=delta):
                call = self._call(index)
                return self, [ToolArgsOut(call.call_id, call.name, delta, self.model_call_id)]
            case ev.ToolCallEnded(index=index, arguments=arguments):
                call = self._call(index)
                calls = tuple(replace(c, complete=arguments) if c is call else c for c in self.calls)
                return replace(self, calls=calls), []
            case ev.UsageReported(usage=usage):
                if self.usage is not None:
                    raise ModelProtocolError("a second usage report in one provider call")
                return replace(self, usage=usage), [TokensOut(usage.output_tokens)]
            case ev.Done():
                if self.usage is None:
                    raise ModelProtocolError("Done without a usage report")
                if event.reason == "tool_use" and not self.calls:
                    raise ModelProtocolError("Done(tool_use) without tool calls")
                if event.reason == "stop" and self.calls:
                    raise ModelProtocolError("Done(stop) with tool calls")
                if any(c.complete is None for c in self.calls):
                    raise ModelProtocolError("Done with an unfinished tool call")
                fold, out = self._close_thinking(now_s)
                return replace(fold, done=event), out
        raise ModelProtocolError(f"unknown model event {event!r}")

    def handle_all(self, events: tuple[ev.ModelEvent, ...], now_s: float) -> tuple[CallFold, list[Emit]]:
        """``handle`` of each event in turn. A run of text deltas outside a thinking phase (most
        of a stream) extends the text chain in place and makes one new fold, not one per delta."""
        fold, out = self, []
        text: Chunks | bool = False  # the chain being extended, False when none is
        for event in events:
            if (
                type(event) is ev.TextDelta
                and fold.done is None
                and (fold.thinking_first is None or fold.thinking_done)
            ):
                text = (fold.text if text is False else text, event.text)  # type: ignore[assignment]
                out.append(TextOut(event.text))
                continue
            if text is not False:
                fold, text = _replace_fold(fold, text=text), False
            fold, emits = fold.handle(event, now_s)
            out += emits
        if text is not False:
            fold = _replace_fold(fold, text=text)
        return fold, out

    def result(self) -> ModelCallResult:
        if self.done is None or self.usage is None:
            raise ModelProtocolError("provider call has not finished")
        calls = tuple(
            ToolCall(c.call_id, c.name, join_surrogates(c.complete or ""), c.index)
            for c in sorted(self.calls, key=lambda c: c.index)
        )
        replay: ReplayState | None = self.done.replay
        message = Message(
            role="assistant",
            origin="assistant",
            text=join_surrogates(_join(self.text)),
            thinking=join_surrogates(_join(self.thinking)),
            replay=replay,
            tool_calls=calls,
            model_call_id=self.model_call_id,
        )
        return ModelCallResult(message, self.usage, self.done.reason, self.thinking_duration_ms)

    def _call(self, index: int) -> OpenCall:
        for call in self.calls:
            if call.index == index:
                return call
        raise ModelProtocolError(f"tool call index {index} was never started")

    def _close_thinking(self, now_s: float) -> tuple[CallFold, list[Emit]]:
        if self.thinking_first is None or self.thinking_done:
            return self, []
        fold = replace(self, thinking_done=True)
        return fold, [ThinkingDone(fold.thinking_duration_ms)]


_replace_fold = replacer(CallFold)


class ModelCall:
    """A ``CallFold`` kept in one place, for callers that fold a call on their own."""

    def __init__(self, model_call_id: str) -> None:
        self.fold = CallFold(model_call_id)

    @property
    def thinking_duration_ms(self) -> int:
        return self.fold.thinking_duration_ms

    def handle(self, event: ev.ModelEvent, now_s: float) -> list[Emit]:
        self.fold, emits = self.fold.handle(event, now_s)
        return emits

    def result(self) -> ModelCallResult:
        return self.fold.result()
