from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from byok.model.messages import ReplayState, ToolCall
from byok.model.request import (
    AssistantTurn,
    ModelRequest,
    ModelSettings,
    ToolResultTurn,
    ToolSpec,
    UserTurn,
)
from byok.model.usage import Usage
from byok.providers.anthropic_request import DEFAULT_MAX_TOKENS, build_request
from byok.providers.anthropic_stream import AnthropicStreamParser
from tests.support.provider_fixtures import own_fixtures, parse_all, shared_fixtures

FIXTURES = own_fixtures("anthropic")
SHARED = shared_fixtures("anthropic")  # absent on a fresh clone


def parse(*chunks: bytes) -> list[ModelEvent]:
    return parse_all(AnthropicStreamParser, chunks)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sse(*objs: dict[str, Any]) -> bytes:
    return b"".join(f"event: {o['type']}\ndata: {json.dumps(o)}\n\n".encode() for o in objs)


START = {"type": "message_start", "message": {"usage": {"input_tokens": 4, "output_tokens": 1}}}
STOP = {"type": "message_stop"}


def block(index: int, content_block: dict[str, Any], *deltas: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": content_block},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def stop_with(reason: str | None, output_tokens: int = 2) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": reason},
        "usage": {"output_tokens": output_tokens},
    }


TEXT = block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": "x"})


def replay_blocks(events: list[ModelEvent]) -> list[dict[str, Any]]:
    last = events[-1]
    assert isinstance(last, Done) and last.replay is not None and last.replay.provider_kind == "anthropic"
    return json.loads(last.replay.data)["blocks"]


def assert_well_formed(events: list[ModelEvent]) -> None:
    assert isinstance(events[0], Started)
    assert [type(e) for e in events[-2:]] == [UsageReported, Done]
    assert sum(isinstance(e, UsageReported | Done | Started) for e in events) == 3


# --- local fixtures ------------------------------------------------------------------------


def test_text_usage_totals_include_cache_reads_and_writes() -> None:
    # CLARIFICATIONS §6: input_tokens = input + cache_read + cache_creation; the last
    # message_delta usage overlays the message_start usage.
    assert parse(fixture("text_cached.sse")) == [
        Started(),
        TextDelta("Hello"),
        TextDelta(", wörld ✓"),
        UsageReported(Usage(125, 9, cache_read_tokens=100, cache_write_tokens=20)),
        Done("stop"),
    ]


def test_thinking_redacted_text_and_tool_calls() -> None:
    events = parse(fixture("thinking_tools.sse"))
    assert events[:-1] == [
        Started(),
        ThinkingDelta("I should read"),
        ThinkingDelta(" both files."),  # the empty thinking delta yields nothing
        ThinkingEnded(),
        TextDelta("Reading."),
        ToolCallStarted(0, "toolu_a", "read_file"),
        ToolCallArgsDelta(0, '{"path": '),
        ToolCallArgsDelta(0, '"a.py"}'),
        ToolCallStarted(1, "toolu_b", "list_dir"),
        ToolCallEnded(0, '{"path": "a.py"}'),
        ToolCallEnded(1, "{}"),  # no input deltas means no arguments
        UsageReported(Usage(50, 88, cache_read_tokens=0, cache_write_tokens=0, reasoning_tokens=40)),
    ]
    assert events[-1].reason == "tool_use"
    assert replay_blocks(events) == [
        {"type": "thinking", "thinking": "I should read both files.", "signature": "sig-AAA="},
        {"type": "redacted_thinking", "data": "opaque-BBB"},
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "toolu_a", "name": "read_file"},
        {"type": "tool_use", "id": "toolu_b", "name": "list_dir"},
    ]


def test_stop_sequence_is_a_normal_stop() -> None:
    events = parse(fixture("stop_sequence.sse"))
    assert events[-2:] == [UsageReported(Usage(3, 2, 0, 0)), Done("stop")]


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("max_tokens.sse", r"output token limit \(stop_reason=max_tokens\)"),
        ("refusal.sse", r"refused.*stop_reason=refusal"),
        ("pause_turn.sse", r"server paused the turn"),
        ("unclosed_block.sse", r"content block 0 still open"),
        ("truncated.sse", r"mid-event before message_stop"),
    ],
)
def test_failures(name: str, pattern: str) -> None:
    with pytest.raises(ProviderError, match=pattern) as e:
        parse(fixture(name))
    assert not e.value.retryable
    assert e.value.output_limit == (name == "max_tokens.sse")


def test_overloaded_error_after_output_is_retryable_kind() -> None:
    with pytest.raises(ProviderError, match="overloaded_error: Overloaded") as e:
        parse(fixture("overloaded_midstream.sse"))
    assert (e.value.retryable, e.value.status) == (True, 529)
    with pytest.raises(ProviderError, match="invalid_request_error: bad") as e:
        parse(sse({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}))
    assert not e.value.retryable


LOCAL_OK = ["text_cached.sse", "thinking_tools.sse", "stop_sequence.sse"]


@pytest.mark.parametrize("name", LOCAL_OK)
def test_byte_by_byte_equals_whole(name: str) -> None:
    raw = fixture(name)
    whole = parse(raw)
    assert_well_formed(whole)
    assert parse(*(raw[i : i + 1] for i in range(len(raw)))) == whole
    assert parse(raw.replace(b"\n", b"\r\n")) == whole


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(LOCAL_OK), cuts=st.lists(st.integers(min_value=0, max_value=8000), max_size=30))
def test_arbitrary_chunking_does_not_change_events(name: str, cuts: list[int]) -> None:
    raw = fixture(name)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert parse(*pieces) == parse(raw)


# --- shared recorded fixtures (optional) ---------------------------------------------------

# name -> expected reason, or "error:<pattern>"; only structure is asserted.
SHARED_EXPECTED = {
    "anthropic-haiku45-text.sse": "stop",
    "anthropic-overloaded-error-event.sse": "error:overloaded_error",
    "anthropic-sonnet4-thinking-signature.sse": "stop",
    "anthropic-sonnet45-parallel-tool-use.sse": "tool_use",
    "anthropic-sonnet45-pause-turn-web-search.sse": "error:server paused the turn",
    "anthropic-sonnet45-text-then-tool-no-args.sse": "tool_use",
    "anthropic-sonnet46-cache-read-max-tokens.sse": "error:max_tokens",
}
SHARED_FILES = sorted(SHARED.glob("*.sse")) if SHARED.is_dir() else []


@pytest.mark.parametrize("path", SHARED_FILES or [None], ids=lambda p: p.name if p else "absent")
def test_shared_recorded_fixture(path: Path | None) -> None:
    if path is None:
        pytest.skip(f"{SHARED} not present")
    raw = path.read_bytes()
    expected = SHARED_EXPECTED.get(path.name, "error:" if "error" in path.name else "")
    if expected.startswith("error:"):
        with pytest.raises(ProviderError, match=expected.partition(":")[2]):
            parse(raw)
        return
    events = parse(raw)
    assert_well_formed(events)
    assert parse(*(raw[i : i + 97] for i in range(0, len(raw), 97))) == events
    ended = [e for e in events if isinstance(e, ToolCallEnded)]
    for e in ended:
        assert isinstance(json.loads(e.arguments), dict)
    assert events[-1].reason == (expected or ("tool_use" if ended else "stop"))
    thinking = any(isinstance(e, ThinkingDelta) for e in events)
    assert (events[-1].replay is not None) == thinking
    if thinking:
        blocks = replay_blocks(events)
        assert blocks[0]["type"] == "thinking" and blocks[0]["signature"]
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert "".join(b.get("text", "") for b in blocks if b["type"] == "text") == text


# --- parser edge cases ---------------------------------------------------------------------


def test_end_turn_with_calls_is_a_tool_turn_and_tool_use_without_calls_fails() -> None:
    call = block(0, {"type": "tool_use", "id": "t1", "name": "ls", "input": {}})
    events = parse(sse(START, *call, stop_with("end_turn"), STOP))
    assert events[-3:] == [ToolCallEnded(0, "{}"), UsageReported(Usage(4, 2)), Done("tool_use")]
    with pytest.raises(ProviderError, match="without any tool_use block"):
        parse(sse(START, *TEXT, stop_with("tool_use"), STOP))


@pytest.mark.parametrize("reason", [None, "model_context_window_exceeded", "weird"])
def test_missing_or_unknown_stop_reason(reason: str | None) -> None:
    with pytest.raises(ProviderError, match="unexpected stop_reason"):
        parse(sse(START, *TEXT, stop_with(reason), STOP))


def test_malformed_streams() -> None:
    with pytest.raises(ProviderError, match="invalid JSON"):
        parse(b"event: message_start\ndata: {nope\n\n")
    with pytest.raises(ProviderError, match="before message_start"):
        parse(sse(*TEXT))
    with pytest.raises(ProviderError, match="not open"):
        parse(sse(START, {"type": "content_block_delta", "index": 5, "delta": {"type": "text_delta"}}))
    with pytest.raises(ProviderError, match="started twice"):
        parse(sse(START, TEXT[0], TEXT[0]))
    with pytest.raises(ProviderError, match="without an id and name"):
        parse(sse(START, *block(0, {"type": "tool_use", "id": "t1", "input": {}})))
    bad_args = {"type": "input_json_delta", "partial_json": '{"a": '}
    with pytest.raises(ProviderError, match="not a JSON object"):
        parse(sse(START, *block(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}}, bad_args)))
    with pytest.raises(ProviderError, match="before message_stop"):
        parse(sse(START, *TEXT, stop_with("end_turn")))
    with pytest.raises(ProviderError, match="usage without token counts"):
        parse(sse({"type": "message_start", "message": {}}, *TEXT, stop_with("end_turn", None), STOP))


def test_unknown_events_ignored_and_server_blocks_kept_verbatim() -> None:
    server = block(
        1,
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
        {"type": "input_json_delta", "partial_json": '{"q": "x"}'},
    )
    events = parse(
        sse(START, {"type": "future_event"}, *TEXT, *server, stop_with("end_turn"), STOP, {"type": "late"})
    )
    assert events[:2] == [Started(), TextDelta("x")] and events[-1].reason == "stop"
    assert replay_blocks(events) == [
        {"type": "text", "text": "x"},
        {"type": "server_tool_use",
         "block": {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"q": "x"}}},
    ]  # fmt: skip


# --- build_request -------------------------------------------------------------------------

TOOL = ToolSpec("read_file", "Read a file", '{"properties":{"path":{"type":"string"}},"type":"object"}')
CALL = ToolCall("toolu_1", "read_file", '{"path": "a.py"}', 0)


def request(*history: Any, system: str = "Be brief.", **settings: Any) -> ModelRequest:
    return ModelRequest(system, (TOOL,), tuple(history), ModelSettings("claude-x", **settings))


def messages(*history: Any) -> list[dict[str, Any]]:
    return json.loads(build_request(request(*history)))["messages"]


def test_build_request_exact_json() -> None:
    req = request(
        UserTurn("hi é"),
        AssistantTurn("Let me look.", "because", ReplayState("openai_chat", "{}"), (CALL,)),
        ToolResultTurn("toolu_1", "read_file", "no such file", is_error=True),
        AssistantTurn("Done."),
        max_output_tokens=1000,
        extra_body=(("thinking", {"type": "enabled", "budget_tokens": 512}),),
    )
    assert (
        build_request(req)
        == (
            '{"model":"claude-x","max_tokens":1000,"stream":true,"system":"Be brief.","messages":['
            '{"role":"user","content":"hi é"},'
            '{"role":"assistant","content":[{"type":"text","text":"Let me look."},'
            '{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"a.py"}}]},'
            '{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",'
            '"content":"no such file","is_error":true}]},'
            '{"role":"assistant","content":[{"type":"text","text":"Done."}]}],'
            '"tools":[{"name":"read_file","description":"Read a file",'
            '"input_schema":{"properties":{"path":{"type":"string"}},"type":"object"}}],'
            '"thinking":{"type":"enabled","budget_tokens":512}}'
        ).encode()
    )


def test_build_request_minimal_defaults() -> None:
    body = json.loads(build_request(ModelRequest("", (), (UserTurn("x"),), ModelSettings("m"))))
    assert body == {"model": "m", "max_tokens": DEFAULT_MAX_TOKENS, "stream": True,
                    "messages": [{"role": "user", "content": "x"}]}  # fmt: skip


def test_same_role_items_merge_so_roles_alternate() -> None:
    call2 = ToolCall("toolu_2", "ls", "", 1)
    assert messages(
        UserTurn("a"),
        UserTurn("b"),
        AssistantTurn("", tool_calls=(CALL, call2)),
        ToolResultTurn("toolu_1", "read_file", "r1"),
        ToolResultTurn("toolu_2", "ls", "r2"),
        UserTurn("stop that"),  # the user interrupted: text after the results, one message
        AssistantTurn(""),  # empty: left out, so the user turns around it merge too
        UserTurn("c"),
    ) == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}},
            {"type": "tool_use", "id": "toolu_2", "name": "ls", "input": {}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r1"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "r2"},
            {"type": "text", "text": "stop that"},
            {"type": "text", "text": "c"},
        ]},
    ]  # fmt: skip


def _messages_bytes(body: bytes) -> bytes:
    text = body.decode()
    start = text.index('"messages":') + len('"messages":')
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end].encode()


def test_messages_prefix_property() -> None:
    replay = parse(fixture("thinking_tools.sse"))[-1].replay
    calls = (
        ToolCall("toolu_a", "read_file", '{"path": "a.py"}', 0),
        ToolCall("toolu_b", "list_dir", "{}", 1),
    )
    h1 = (
        UserTurn("a"),
        AssistantTurn("Reading.", "t", replay, calls),
        ToolResultTurn("toolu_a", "read_file", "r1"),
        ToolResultTurn("toolu_b", "list_dir", "r2"),
    )
    h2 = (*h1, AssistantTurn("done"), UserTurn("again"))
    m1, m2 = _messages_bytes(build_request(request(*h1))), _messages_bytes(build_request(request(*h2)))
    assert m1.endswith(b"]") and m2.startswith(m1[:-1] + b",")


SAVED = ReplayState(
    "anthropic",
    json.dumps(
        {
            "blocks": [
                {"type": "thinking", "thinking": "hm", "signature": "S"},
                {"type": "text", "text": ""},
                {"type": "text", "text": "Hi"},
                {"type": "tool_use", "id": "t1", "name": "ls"},
                {"type": "redacted_thinking", "data": "R"},
                {"type": "tool_use", "id": "t2", "name": "cat"},
                {"type": "server_tool_use", "block": {"type": "server_tool_use", "id": "s"}},
            ]
        }
    ),
)


def test_replay_keeps_block_order_and_drops_unanswered_calls() -> None:
    turn = AssistantTurn("Hi", "hm", SAVED, (ToolCall("t2", "cat", '{"f": 1}', 1),))
    assert messages(UserTurn("u"), turn)[1]["content"] == [
        {"type": "thinking", "thinking": "hm", "signature": "S"},
        {"type": "text", "text": "Hi"},  # the empty text block is left out: the API rejects it
        {"type": "redacted_thinking", "data": "R"},
        {"type": "tool_use", "id": "t2", "name": "cat", "input": {"f": 1}},
        {"type": "server_tool_use", "id": "s"},
    ]


def test_replay_with_diverging_text_unknown_calls_or_bad_state() -> None:
    extra = ToolCall("t9", "grep", "not json", 2)
    turn = AssistantTurn("Other", "", SAVED, (ToolCall("t1", "ls", "{}", 0), extra))
    assert messages(UserTurn("u"), turn)[1]["content"] == [
        {"type": "thinking", "thinking": "hm", "signature": "S"},
        {"type": "text", "text": "Other"},
        {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
        {"type": "redacted_thinking", "data": "R"},
        {"type": "server_tool_use", "id": "s"},
        {"type": "tool_use", "id": "t9", "name": "grep", "input": {"_invalid_arguments": "not json"}},
    ]
    for state in (ReplayState("anthropic", "nope"), ReplayState("openai_responses", SAVED.data)):
        assert messages(UserTurn("u"), AssistantTurn("t", "", state))[1]["content"] == [
            {"type": "text", "text": "t"}
        ]
