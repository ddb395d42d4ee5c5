"""One provider call folded into UI emits and, at Done, one assistant message.

Only ``Done`` produces a message (invariant 4): partial deltas are UI only. The caller
passes a monotonic time with each event so thinking duration is measured without a clock.
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


@attrs.define
class _OpenCall:
    call_id: str
    name: str
    args: list[str] = attrs.Factory(list)
    complete: str | None = None


@attrs.define
class ModelCall:
    model_call_id: str
    _text: list[str] = attrs.Factory(list)
    _thinking: list[str] = attrs.Factory(list)
    _thinking_first: float | None = None
    _thinking_last: float | None = None
    _thinking_done: bool = False
    _calls: dict[int, _OpenCall] = attrs.Factory(dict)
    _usage: Usage | None = None
    _done: ev.Done | None = None

    @property
    def thinking_duration_ms(self) -> int:
        if self._thinking_first is None or self._thinking_last is None:
            return 0
        # Cursor shows "thought for 0s" as a broken card; report at least 1 ms.
        return max(1, round((self._thinking_last - self._thinking_first) * 1000))

    def handle(self, event: ev.ModelEvent, now_s: float) -> list[Emit]:
        if self._done is not None:
            raise ModelProtocolError(f"event after Done: {type(event).__name__}")
        match event:
            case ev.Started():
                return []
            case ev.TextDelta(text=text):
                out = self._close_thinking(now_s)
                self._text.append(text)
                return [*out, TextOut(text)]
            case ev.ThinkingDelta(text=text):
                if self._thinking_done:
                    # A second reasoning phase (interleaved thinking) reopens the card.
                    self._thinking_done = False
                if self._thinking_first is None:
                    self._thinking_first = now_s
                self._thinking_last = now_s
                self._thinking.append(text)
                return [ThinkingOut(text)]
            case ev.ThinkingEnded():
                return self._close_thinking(now_s)
            case ev.ToolCallStarted(index=index, call_id=call_id, name=name):
                if index in self._calls:
                    raise ModelProtocolError(f"tool call index {index} started twice")
                if any(c.call_id == call_id for c in self._calls.values()):
                    # Results are matched to calls by id: a round with two calls of one id
                    # could never complete (its run would wait for the second result forever).
                    raise ModelProtocolError(f"tool call id {call_id!r} used by two calls")
                out = self._close_thinking(now_s)
                self._calls[index] = _OpenCall(call_id, name)
                return [*out, ToolCallOpened(call_id, name, self.model_call_id)]
            case ev.ToolCallArgsDelta(index=index, delta=delta):
                call = self._call(index)
                call.args.append(delta)
                return [ToolArgsOut(call.call_id, call.name, delta, self.model_call_id)]
            case ev.ToolCallEnded(index=index, arguments=arguments):
                self._call(index).complete = arguments
                return []
            case ev.UsageReported(usage=usage):
                if self._usage is not None:
                    raise ModelProtocolError("a second usage report in one provider call")
                self._usage = usage
                return [TokensOut(usage.output_tokens)]
            case ev.Done():
                if self._usage is None:
                    raise ModelProtocolError("Done without a usage report")
                if event.reason == "tool_use" and not self._calls:
                    raise ModelProtocolError("Done(tool_use) without tool calls")
                if event.reason == "stop" and self._calls:
                    raise ModelProtocolError("Done(stop) with tool calls")
                if any(c.complete is None for c in self._calls.values()):
                    raise ModelProtocolError("Done with an unfinished tool call")
                out = self._close_thinking(now_s)
                self._done = event
                return out
        raise ModelProtocolError(f"unknown model event {event!r}")

    def result(self) -> ModelCallResult:
        if self._done is None or self._usage is None:
            raise ModelProtocolError("provider call has not finished")
        calls = tuple(
            ToolCall(c.call_id, c.name, join_surrogates(c.complete or ""), index)
            for index, c in sorted(self._calls.items())
        )
        replay: ReplayState | None = self._done.replay
        message = Message(
            role="assistant",
            origin="assistant",
            text=join_surrogates("".join(self._text)),
            thinking=join_surrogates("".join(self._thinking)),
            replay=replay,
            tool_calls=calls,
            model_call_id=self.model_call_id,
        )
        return ModelCallResult(message, self._usage, self._done.reason, self.thinking_duration_ms)

    def _call(self, index: int) -> _OpenCall:
        try:
            return self._calls[index]
        except KeyError:
            raise ModelProtocolError(f"tool call index {index} was never started") from None

    def _close_thinking(self, now_s: float) -> list[Emit]:
        if self._thinking_first is None or self._thinking_done:
            return []
        self._thinking_done = True
        return [ThinkingDone(self.thinking_duration_ms)]
