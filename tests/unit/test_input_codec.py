"""The input log's codec: every logged input comes back equal, through JSON text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.loop.input_codec import CodecError, decode_event, decode_input, encode_event, encode_input
from byok.loop.turn_values import (
    Begin,
    Cancel,
    Committed,
    Failed,
    Fault,
    ModelEnded,
    ModelEvents,
    ModelFailed,
    Published,
)
from byok.model import events as ev
from byok.model.messages import Message, ReplayState, ToolCall
from byok.model.usage import Usage

text = st.text()  # lone surrogates included: JSON must keep them
small = st.integers(min_value=0, max_value=2**31)
events = st.one_of(
    st.just(ev.Started()),
    st.builds(ev.TextDelta, text),
    st.builds(ev.ThinkingDelta, text),
    st.just(ev.ThinkingEnded()),
    st.builds(ev.ToolCallStarted, small, text, text),
    st.builds(ev.ToolCallArgsDelta, small, text),
    st.builds(ev.ToolCallEnded, small, text),
    st.builds(
        ev.UsageReported,
        st.builds(Usage, small, small, st.none() | small, st.none() | small, st.none() | small),
    ),
    st.builds(ev.Done, st.sampled_from(["stop", "tool_use"]), st.none() | st.builds(ReplayState, text, text)),
)


def through_json(obj: object) -> object:
    return json.loads(json.dumps(obj))


@given(st.lists(events, max_size=8), st.floats(allow_nan=False, allow_infinity=False))
def test_model_events_round_trip(batch: list[ev.ModelEvent], now: float) -> None:
    inp = ModelEvents(tuple(batch), now)
    assert decode_input(through_json(encode_input(inp))) == inp  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "inp",
    [
        ModelEnded(),
        ModelFailed(Failed("unavailable", "HTTP 500 \ud800", provider=True)),
        Committed(),
        Published("settled"),
        Fault(Failed("internal", "checkpoint not published")),
        Cancel(),
        Begin("r", "ask", "call", frozenset({"Read"}), frozenset({"Read", "Write"})),
        Begin(
            "r",
            "agent",
            "tools",
            frozenset(),
            frozenset(),
            staged=Message(
                role="assistant",
                origin="assistant",
                text="x",
                tool_calls=(ToolCall("c", "Read", "{}", 0),),
                tool_round_id="round",
                model_call_id="mc",
            ),
        ),
    ],
)
def test_inputs_round_trip(inp: object) -> None:
    assert decode_input(through_json(encode_input(inp))) == inp  # type: ignore[arg-type]


def test_bad_lines_are_codec_errors() -> None:
    with pytest.raises(CodecError):
        decode_input({"k": "teleport"})
    with pytest.raises(CodecError):
        decode_input({"k": "published"})
    with pytest.raises(CodecError):
        decode_event(["t", 3])
    with pytest.raises(CodecError):
        encode_event(object())  # type: ignore[arg-type]
