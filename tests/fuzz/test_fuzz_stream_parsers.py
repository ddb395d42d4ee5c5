"""Fuzzing the provider stream parsers (Chat, Responses, Anthropic): arbitrary bytes and perturbed
valid streams end in ProviderError or an accepted stream that keeps the event contract, and
chunking never changes the answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from byok.model import events as ev
from byok.model.events import ProviderError
from byok.model.usage import Usage
from tests.fuzz.provider_streams import PARSERS, SKELETONS, Parser, Turn, sse_wire
from tests.fuzz.stream_perturbations import perturbed_wire, stream_cases
from tests.fuzz.support import cut_offsets, fuzz, known_bug, split


def _parse(make: Callable[[], Parser], pieces: list[bytes]) -> list[ev.ModelEvent]:
    p = make()
    out: list[ev.ModelEvent] = []
    for piece in pieces:
        out += p.feed(piece)
    out += p.end()
    return out


def _check_event_contract(events: list[ev.ModelEvent]) -> None:
    """What a parser promises for a stream it accepted (model/events.py)."""
    assert isinstance(events[0], ev.Started)
    assert sum(isinstance(e, ev.Started) for e in events) == 1
    assert isinstance(events[-1], ev.Done)
    assert sum(isinstance(e, ev.Done) for e in events) == 1
    assert sum(isinstance(e, ev.UsageReported) for e in events) == 1
    started = [e.index for e in events if isinstance(e, ev.ToolCallStarted)]
    ended = [e.index for e in events if isinstance(e, ev.ToolCallEnded)]
    assert len(set(started)) == len(started) and len(set(ended)) == len(ended)
    assert sorted(ended) == sorted(started)
    assert {e.index for e in events if isinstance(e, ev.ToolCallArgsDelta)} <= set(started)
    assert events[-1].reason == ("tool_use" if started else "stop")


def _run_parser(kind: str, pieces: list[bytes]) -> tuple[str, Any]:
    try:
        events = _parse(PARSERS[kind], pieces)
    except ProviderError as e:
        assert isinstance(e.message, str)
        return ("error", None)
    _check_event_contract(events)
    return ("ok", events)


def _parser_property(kind: str, wire: bytes, cuts: list[int]) -> None:
    try:
        whole = _run_parser(kind, [wire])
        chunked = _run_parser(kind, split(wire, cuts))
    except Exception as e:
        if known_bug(e):
            return
        raise
    assert chunked == whole


@fuzz(300)
@given(st.sampled_from(sorted(PARSERS)), st.binary(max_size=300), cut_offsets)
def test_stream_parsers_on_arbitrary_bytes(kind: str, wire: bytes, cuts: list[int]) -> None:
    _parser_property(kind, wire, cuts)


def _expected_usage(kind: str, t: Turn) -> Usage:
    a, b, c, d = t.usage
    if kind == "anthropic":  # input_tokens excludes cache reads and writes; byok reports the total
        return Usage(a + c + d, b, cache_read_tokens=c, cache_write_tokens=d)
    return Usage(a, b, cache_read_tokens=c, reasoning_tokens=d)


def _answer(events: list[ev.ModelEvent]) -> dict[str, Any]:
    """What a turn said, as a consumer sees it in the events."""
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ev.ToolCallArgsDelta):
            args[e.index] = args.get(e.index, "") + e.delta
    ended = {e.index: e.arguments for e in events if isinstance(e, ev.ToolCallEnded)}
    return {
        "text": "".join(e.text for e in events if isinstance(e, ev.TextDelta)),
        "thinking": "".join(e.text for e in events if isinstance(e, ev.ThinkingDelta)),
        "calls": [
            (e.index, e.call_id, e.name, ended.get(e.index), args.get(e.index, ""))
            for e in events
            if isinstance(e, ev.ToolCallStarted)
        ],
        "usage": [e.usage for e in events if isinstance(e, ev.UsageReported)],
        "reason": events[-1].reason if isinstance(events[-1], ev.Done) else None,
    }


def _expected_answer(kind: str, t: Turn) -> dict[str, Any]:
    return {
        "text": "".join(t.text),
        "thinking": "".join(t.thinking),
        "calls": [(i, c, n, "".join(f), "".join(f)) for i, (c, n, f) in enumerate(t.calls)],
        "usage": [_expected_usage(kind, t)],
        "reason": "tool_use" if t.calls else "stop",
    }


_GOOD_TURN = Turn(
    thinking=("Let me", " look."),
    text=("Reading ", "a.py"),
    calls=(("c1", "Read", ('{"path": ', '"a.py"}')), ("c2", "Grep", ('{"x": 1}',))),
    usage=(10, 5, 2, 1),
    alt=True,
    tail=False,
)


def test_skeleton_streams_are_accepted_with_their_content() -> None:
    """The skeletons the property perturbs are valid streams for today's parsers (else the
    property would only ever see errors) and say exactly what their turn says."""
    plain = _GOOD_TURN._replace(thinking=(), calls=(), alt=False, tail=True)
    for kind in sorted(PARSERS):
        for turn in (_GOOD_TURN, plain, _GOOD_TURN._replace(tail=True, alt=False)):
            outcome, events = _run_parser(kind, [sse_wire(SKELETONS[kind](turn))])
            assert outcome == "ok", (kind, turn)
            assert _answer(events) == _expected_answer(kind, turn), (kind, turn)


def test_stream_parsers_on_arbitrary_event_structures() -> None:
    """Valid streams of each provider, perturbed: ProviderError, or an accepted stream that keeps
    the event contract (_check_event_contract); chunking never changes the answer; an
    unperturbed stream is accepted and says exactly what its turn says. The tally at the end
    makes sure accepted streams (perturbed ones too) really reach the contract check."""
    tally: Counter[tuple[str, str, bool]] = Counter()

    @fuzz(400)
    @example(("openai_chat", _GOOD_TURN, ()), [7, 90, 91])
    @example(("openai_responses", _GOOD_TURN, ()), [300])
    @example(("anthropic", _GOOD_TURN, ()), [1, 2, 3])
    @example(("anthropic", _GOOD_TURN, (("dup", 3),)), [])  # a repeated thinking delta: still valid
    @given(stream_cases(), cut_offsets)
    def prop(case: tuple[str, Turn, tuple[tuple[Any, ...], ...]], cuts: list[int]) -> None:
        kind, turn, ops = case
        wire = perturbed_wire(SKELETONS[kind](turn), ops)
        whole = _run_parser(kind, [wire])
        chunked = _run_parser(kind, split(wire, cuts))
        assert chunked == whole
        tally[kind, whole[0], bool(ops)] += 1
        if not ops:
            assert whole[0] == "ok"
            assert _answer(whole[1]) == _expected_answer(kind, turn)

    prop()
    total = sum(tally.values())
    for kind in PARSERS:
        # Measured: 40-60% of each kind's examples are accepted, 5-30% of the perturbed ones.
        assert tally[kind, "ok", False] + tally[kind, "ok", True] >= total // 30, tally
        assert tally[kind, "ok", True] >= 2, tally


def _parser_bug(kind: str, events: list[Any]) -> None:
    """Helper for the pinned parser bugs: the stream must end in ProviderError, nothing else."""
    wire = sse_wire([(None, e) for e in events])
    with pytest.raises(ProviderError):
        _parse(PARSERS[kind], [wire])


def test_anthropic_event_type_that_is_not_a_string() -> None:
    _parser_bug("anthropic", [{"type": {}}])


def test_chat_tool_call_function_that_is_not_an_object() -> None:
    _parser_bug("openai_chat", [{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]}])


def test_chat_usage_details_that_are_not_objects() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": "x"}
    _parser_bug("openai_chat", [{"usage": usage}])


@pytest.mark.parametrize(
    "event",
    [
        {"type": "response.incomplete", "response": "x"},
        {"type": "response.reasoning_summary_part.added", "summary_index": "x"},
        {"type": "response.output_text.delta", "delta": "a", "item": "x"},
        {"type": "response.output_text.delta", "delta": "a", "item_id": [1]},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {"type": "message", "content": [{"text": 5}]},
        },
        {
            "type": "response.completed",
            "response": {"usage": {"input_tokens": 1, "output_tokens": 1, "input_tokens_details": "x"}},
        },
    ],
)
def test_responses_fields_of_the_wrong_json_type(event: dict[str, Any]) -> None:
    _parser_bug("openai_responses", [event])


@pytest.mark.parametrize(
    "events",
    [
        [{"type": "message_start", "message": "x"}],
        [
            {"type": "message_start"},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "content_block_delta", "index": 0, "delta": "x"},
        ],
        [{"type": "message_start"}, {"type": "message_delta", "delta": "x"}],
        [
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 1, "output_tokens": 1, "output_tokens_details": "x"}},
            },
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
            {"type": "message_stop"},
        ],
    ],
)
def test_anthropic_fields_of_the_wrong_json_type(events: list[Any]) -> None:
    _parser_bug("anthropic", events)
