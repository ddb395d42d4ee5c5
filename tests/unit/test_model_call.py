"""ModelCall: one provider call's ModelEvents folded into UI emits and one assistant Message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.loop.emits import (
    TextOut,
    ThinkingDone,
    ThinkingOut,
    TokensOut,
    ToolArgsOut,
    ToolCallOpened,
)
from byok.loop.model_call import CallFold, ModelCall, ModelProtocolError
from byok.model import events as ev
from byok.model.messages import ReplayState, ToolCall
from byok.model.usage import Usage

USAGE = Usage(input_tokens=100, output_tokens=42, reasoning_tokens=7)


def feed(call: ModelCall, events: list[ev.ModelEvent], start: float = 0.0, step: float = 0.0) -> list:
    out: list = []
    t = start
    for e in events:
        out += call.handle(e, t)
        t += step
    return out


def tool(index: int, call_id: str, name: str, args: str) -> list[ev.ModelEvent]:
    return [
        ev.ToolCallStarted(index, call_id, name),
        ev.ToolCallArgsDelta(index, args),
        ev.ToolCallEnded(index, args),
    ]


# -- emits -----------------------------------------------------------------------------------------


def test_text_only_call() -> None:
    call = ModelCall("mc-1")
    emits = feed(
        call,
        [ev.Started(), ev.TextDelta("Hel"), ev.TextDelta("lo"), ev.UsageReported(USAGE), ev.Done("stop")],
    )
    assert emits == [TextOut("Hel"), TextOut("lo"), TokensOut(42)]
    result = call.result()
    assert result.reason == "stop"
    assert result.usage == USAGE
    assert result.thinking_duration_ms == 0
    msg = result.message
    assert (msg.role, msg.origin, msg.text, msg.thinking) == ("assistant", "assistant", "Hello", "")
    assert msg.tool_calls == ()
    assert msg.model_call_id == "mc-1"
    assert msg.replay is None


def test_tokens_out_reports_output_tokens_of_the_usage() -> None:
    call = ModelCall("mc")
    assert call.handle(ev.UsageReported(Usage(5, 1234)), 0.0) == [TokensOut(1234)]


def test_thinking_then_text_emits_thinking_done_once_before_the_first_text() -> None:
    call = ModelCall("mc")
    emits = [
        *call.handle(ev.ThinkingDelta("hmm "), 10.0),
        *call.handle(ev.ThinkingDelta("ok"), 10.25),
        *call.handle(ev.TextDelta("A"), 11.0),
        *call.handle(ev.TextDelta("B"), 11.5),
        *call.handle(ev.UsageReported(USAGE), 12.0),
        *call.handle(ev.Done("stop"), 12.0),
    ]
    assert emits == [
        ThinkingOut("hmm "),
        ThinkingOut("ok"),
        ThinkingDone(250),
        TextOut("A"),
        TextOut("B"),
        TokensOut(42),
    ]
    result = call.result()
    # Measured from the first to the last thinking event, not to the text that closed it.
    assert result.thinking_duration_ms == 250
    assert result.message.thinking == "hmm ok"
    assert result.message.text == "AB"


def test_single_thinking_event_reports_at_least_one_ms() -> None:
    call = ModelCall("mc")
    feed(call, [ev.ThinkingDelta("x")], start=5.0)
    emits = call.handle(ev.TextDelta("y"), 9.0)
    assert emits == [ThinkingDone(1), TextOut("y")]
    assert call.thinking_duration_ms == 1


def test_sub_millisecond_thinking_reports_one_ms() -> None:
    call = ModelCall("mc")
    call.handle(ev.ThinkingDelta("a"), 1.0)
    call.handle(ev.ThinkingDelta("b"), 1.0001)
    assert call.thinking_duration_ms == 1


def test_thinking_ended_closes_the_card_and_later_text_does_not_reemit() -> None:
    call = ModelCall("mc")
    call.handle(ev.ThinkingDelta("a"), 0.0)
    call.handle(ev.ThinkingDelta("b"), 2.0)
    assert call.handle(ev.ThinkingEnded(), 3.0) == [ThinkingDone(2000)]
    assert call.handle(ev.TextDelta("t"), 4.0) == [TextOut("t")]
    assert call.handle(ev.ThinkingEnded(), 5.0) == []


def test_thinking_ended_without_thinking_emits_nothing() -> None:
    call = ModelCall("mc")
    assert call.handle(ev.ThinkingEnded(), 0.0) == []
    assert call.handle(ev.TextDelta("t"), 0.0) == [TextOut("t")]


def test_thinking_closed_by_tool_call() -> None:
    call = ModelCall("mc-7")
    call.handle(ev.ThinkingDelta("a"), 0.0)
    call.handle(ev.ThinkingDelta("b"), 0.5)
    emits = call.handle(ev.ToolCallStarted(0, "c0", "read"), 1.0)
    assert emits == [ThinkingDone(500), ToolCallOpened("c0", "read", "mc-7")]
    assert call.handle(ev.ToolCallStarted(1, "c1", "grep"), 1.1) == [ToolCallOpened("c1", "grep", "mc-7")]


def test_thinking_closed_by_done() -> None:
    call = ModelCall("mc")
    call.handle(ev.ThinkingDelta("a"), 0.0)
    call.handle(ev.ThinkingDelta("b"), 0.003)
    call.handle(ev.UsageReported(USAGE), 0.004)
    assert call.handle(ev.Done("stop"), 1.0) == [ThinkingDone(3)]
    assert call.result().message.thinking == "ab"
    assert call.result().message.text == ""


def test_thinking_after_text_reopens_and_closes_again() -> None:
    call = ModelCall("mc")
    call.handle(ev.ThinkingDelta("a"), 0.0)
    assert call.handle(ev.TextDelta("x"), 1.0) == [ThinkingDone(1), TextOut("x")]
    assert call.handle(ev.ThinkingDelta("b"), 2.0) == [ThinkingOut("b")]
    # Interleaved thinking: the card closes again, the duration spans first to last thinking.
    assert call.handle(ev.TextDelta("y"), 3.0) == [ThinkingDone(2000), TextOut("y")]
    feed(call, [ev.UsageReported(USAGE), ev.Done("stop")], start=4.0)
    assert call.result().message.thinking == "ab"
    assert call.result().message.text == "xy"


def test_tool_call_emits_args_deltas_and_result_has_complete_arguments() -> None:
    call = ModelCall("mc-9")
    emits = feed(
        call,
        [
            ev.ToolCallStarted(0, "c0", "read"),
            ev.ToolCallArgsDelta(0, '{"pa'),
            ev.ToolCallArgsDelta(0, 'th":1}'),
            ev.ToolCallEnded(0, '{"path":1}'),
            ev.UsageReported(USAGE),
            ev.Done("tool_use"),
        ],
    )
    assert emits == [
        ToolCallOpened("c0", "read", "mc-9"),
        ToolArgsOut("c0", "read", '{"pa', "mc-9"),
        ToolArgsOut("c0", "read", 'th":1}', "mc-9"),
        TokensOut(42),
    ]
    result = call.result()
    assert result.reason == "tool_use"
    assert result.message.tool_calls == (ToolCall("c0", "read", '{"path":1}', 0),)


def test_result_uses_the_arguments_of_tool_call_ended_not_the_deltas() -> None:
    call = ModelCall("mc")
    feed(
        call,
        [
            ev.ToolCallStarted(0, "c0", "read"),
            ev.ToolCallArgsDelta(0, '{"a"'),
            ev.ToolCallEnded(0, '{"a": 1}'),
            ev.UsageReported(USAGE),
            ev.Done("tool_use"),
        ],
    )
    assert call.result().message.tool_calls[0].arguments == '{"a": 1}'


def test_tool_calls_sorted_by_index_whatever_the_start_order() -> None:
    call = ModelCall("mc")
    feed(
        call,
        [
            *tool(2, "c2", "grep", '{"q":2}'),
            *tool(0, "c0", "read", '{"q":0}'),
            *tool(5, "c5", "ls", '{"q":5}'),
            ev.UsageReported(USAGE),
            ev.Done("tool_use"),
        ],
    )
    calls = call.result().message.tool_calls
    assert [c.index for c in calls] == [0, 2, 5]
    assert [c.call_id for c in calls] == ["c0", "c2", "c5"]
    assert [c.arguments for c in calls] == ['{"q":0}', '{"q":2}', '{"q":5}']


def test_interleaved_tool_call_args() -> None:
    call = ModelCall("mc")
    emits = feed(
        call,
        [
            ev.ToolCallStarted(1, "b", "nb"),
            ev.ToolCallStarted(0, "a", "na"),
            ev.ToolCallArgsDelta(0, "A"),
            ev.ToolCallArgsDelta(1, "B"),
            ev.ToolCallEnded(1, "{}"),
            ev.ToolCallEnded(0, "[]"),
        ],
    )
    assert [e for e in emits if isinstance(e, ToolArgsOut)] == [
        ToolArgsOut("a", "na", "A", "mc"),
        ToolArgsOut("b", "nb", "B", "mc"),
    ]
    feed(call, [ev.UsageReported(USAGE), ev.Done("tool_use")])
    assert call.result().message.tool_calls == (ToolCall("a", "na", "[]", 0), ToolCall("b", "nb", "{}", 1))


def test_done_replay_state_lands_on_the_message() -> None:
    call = ModelCall("mc")
    replay = ReplayState("anthropic", '{"signature":"s"}')
    feed(call, [ev.ThinkingDelta("t"), ev.TextDelta("x"), ev.UsageReported(USAGE), ev.Done("stop", replay)])
    assert call.result().message.replay == replay


def test_text_with_tool_calls_keeps_both() -> None:
    call = ModelCall("mc")
    feed(call, [ev.TextDelta("Let me look."), *tool(0, "c", "read", "{}")])
    feed(call, [ev.UsageReported(USAGE), ev.Done("tool_use")])
    msg = call.result().message
    assert msg.text == "Let me look."
    assert len(msg.tool_calls) == 1


# -- protocol violations ---------------------------------------------------------------------------


def finished(reason: str = "stop") -> ModelCall:
    call = ModelCall("mc")
    if reason == "tool_use":
        feed(call, tool(0, "c", "read", "{}"))
    feed(call, [ev.UsageReported(USAGE), ev.Done(reason)])  # type: ignore[arg-type]
    return call


@pytest.mark.parametrize(
    "event",
    [
        ev.Started(),
        ev.TextDelta("x"),
        ev.ThinkingDelta("x"),
        ev.ThinkingEnded(),
        ev.ToolCallStarted(3, "c3", "read"),
        ev.UsageReported(USAGE),
        ev.Done("stop"),
    ],
)
def test_any_event_after_done_is_rejected(event: ev.ModelEvent) -> None:
    call = finished()
    with pytest.raises(ModelProtocolError):
        call.handle(event, 1.0)


def test_second_usage_report_is_rejected() -> None:
    call = ModelCall("mc")
    call.handle(ev.UsageReported(USAGE), 0.0)
    with pytest.raises(ModelProtocolError):
        call.handle(ev.UsageReported(USAGE), 0.0)


def test_done_without_usage_is_rejected() -> None:
    call = ModelCall("mc")
    call.handle(ev.TextDelta("x"), 0.0)
    with pytest.raises(ModelProtocolError):
        call.handle(ev.Done("stop"), 0.0)


def test_done_tool_use_without_calls_is_rejected() -> None:
    call = ModelCall("mc")
    feed(call, [ev.TextDelta("x"), ev.UsageReported(USAGE)])
    with pytest.raises(ModelProtocolError):
        call.handle(ev.Done("tool_use"), 0.0)


def test_done_stop_with_calls_is_rejected() -> None:
    call = ModelCall("mc")
    feed(call, [*tool(0, "c", "read", "{}"), ev.UsageReported(USAGE)])
    with pytest.raises(ModelProtocolError):
        call.handle(ev.Done("stop"), 0.0)


def test_done_with_an_unfinished_tool_call_is_rejected() -> None:
    call = ModelCall("mc")
    feed(
        call,
        [
            *tool(0, "c0", "read", "{}"),
            ev.ToolCallStarted(1, "c1", "read"),
            ev.ToolCallArgsDelta(1, "{}"),
            ev.UsageReported(USAGE),
        ],
    )
    with pytest.raises(ModelProtocolError):
        call.handle(ev.Done("tool_use"), 0.0)


def test_args_delta_for_unknown_index_is_rejected() -> None:
    call = ModelCall("mc")
    call.handle(ev.ToolCallStarted(0, "c0", "read"), 0.0)
    with pytest.raises(ModelProtocolError):
        call.handle(ev.ToolCallArgsDelta(1, "{}"), 0.0)


def test_tool_call_ended_for_unknown_index_is_rejected() -> None:
    call = ModelCall("mc")
    with pytest.raises(ModelProtocolError):
        call.handle(ev.ToolCallEnded(0, "{}"), 0.0)


def test_duplicate_tool_call_index_is_rejected() -> None:
    call = ModelCall("mc")
    call.handle(ev.ToolCallStarted(0, "c0", "read"), 0.0)
    with pytest.raises(ModelProtocolError):
        call.handle(ev.ToolCallStarted(0, "other", "grep"), 0.0)


def test_two_calls_with_one_id_are_rejected() -> None:
    call = ModelCall("mc")
    call.handle(ev.ToolCallStarted(0, "call_1", "Read"), 0.0)
    with pytest.raises(ModelProtocolError, match="'call_1' used by two calls"):
        call.handle(ev.ToolCallStarted(1, "call_1", "Grep"), 0.0)


def test_result_before_done_is_rejected() -> None:
    call = ModelCall("mc")
    feed(call, [ev.TextDelta("x"), ev.UsageReported(USAGE)])
    with pytest.raises(ModelProtocolError):
        call.result()


def test_rejected_done_does_not_finish_the_call() -> None:
    call = ModelCall("mc")
    call.handle(ev.TextDelta("x"), 0.0)
    with pytest.raises(ModelProtocolError):
        call.handle(ev.Done("stop"), 0.0)
    with pytest.raises(ModelProtocolError):
        call.result()


# -- property --------------------------------------------------------------------------------------

_chunk = st.text(max_size=5)


@given(
    thinking=st.lists(_chunk, max_size=5),
    text=st.lists(_chunk, max_size=5),
    calls=st.dictionaries(
        st.integers(0, 20),
        st.tuples(st.text(min_size=1, max_size=4), st.lists(_chunk, max_size=3)),
        max_size=4,
    ),
    gaps=st.lists(st.floats(0, 5, allow_nan=False), min_size=40, max_size=40),
)
def test_message_is_the_concatenation_of_the_stream(
    thinking: list[str],
    text: list[str],
    calls: dict[int, tuple[str, list[str]]],
    gaps: list[float],
) -> None:
    events: list[ev.ModelEvent] = [ev.Started()]
    events += [ev.ThinkingDelta(t) for t in thinking]
    events += [ev.TextDelta(t) for t in text]
    for index, (name, parts) in sorted(calls.items(), reverse=True):
        events.append(ev.ToolCallStarted(index, f"id{index}", name))
        events += [ev.ToolCallArgsDelta(index, p) for p in parts]
        events.append(ev.ToolCallEnded(index, "".join(parts)))
    events += [ev.UsageReported(USAGE), ev.Done("tool_use" if calls else "stop")]

    call = ModelCall("mc")
    now = 0.0
    times: list[float] = []
    emits = []
    for e, gap in zip(events, gaps + [0.0] * len(events), strict=False):
        now += gap
        if isinstance(e, ev.ThinkingDelta):
            times.append(now)
        emits += call.handle(e, now)
    msg = call.result().message

    assert msg.thinking == "".join(thinking)
    assert msg.text == "".join(text)
    assert [(c.index, c.call_id, c.name, c.arguments) for c in msg.tool_calls] == [
        (i, f"id{i}", name, "".join(parts)) for i, (name, parts) in sorted(calls.items())
    ]
    assert "".join(e.text for e in emits if isinstance(e, TextOut)) == msg.text
    assert "".join(e.text for e in emits if isinstance(e, ThinkingOut)) == msg.thinking
    done = [e for e in emits if isinstance(e, ThinkingDone)]
    if thinking:
        expected = max(1, round((times[-1] - times[0]) * 1000))
        assert done == [ThinkingDone(expected)]
        assert call.result().thinking_duration_ms == expected
        # The card closes before anything that is not thinking is shown.
        first_other = next(
            (i for i, e in enumerate(emits) if isinstance(e, TextOut | ToolCallOpened)), len(emits)
        )
        assert emits.index(done[0]) <= first_other
    else:
        assert done == []
        assert call.result().thinking_duration_ms == 0


_stream_events = st.lists(
    st.one_of(
        st.builds(ev.TextDelta, st.text(max_size=3)),
        st.builds(ev.ThinkingDelta, st.text(max_size=3)),
        st.just(ev.ThinkingEnded()),
        st.just(ev.Started()),
    ),
    max_size=30,
)


@given(_stream_events, st.integers(min_value=1, max_value=7))
def test_handle_all_folds_a_batch_as_handle_does_one_by_one(events: list, batch: int) -> None:
    """The machine hands the fold a provider chunk's events at once: same fold, same emits."""
    one = CallFold("mc")
    one_out: list = []
    for i, e in enumerate(events):
        one, out = one.handle(e, float(i // batch))
        one_out += out
    many = CallFold("mc")
    many_out: list = []
    for start in range(0, len(events), batch):
        many, out = many.handle_all(tuple(events[start : start + batch]), float(start // batch))
        many_out += out
    assert many_out == one_out
    done = (ev.UsageReported(USAGE), ev.Done("stop"))
    assert many.handle_all(done, 99.0)[0].result() == one.handle_all(done, 99.0)[0].result()
