from __future__ import annotations

import json
from pathlib import Path

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
from byok.providers.http_errors import http_error
from byok.providers.openai_chat_request import build_request
from byok.providers.openai_chat_stream import ChatStreamParser
from tests.support.provider_fixtures import own_fixtures, parse_all, shared_fixtures

FIXTURES = own_fixtures("openai_chat")
SHARED = shared_fixtures("openai_chat")  # absent on a fresh clone


def parse(*chunks: bytes) -> list[ModelEvent]:
    return parse_all(ChatStreamParser, chunks)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sse(*objs: object) -> bytes:
    return b"".join(
        b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs
    )


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    return {
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
        "usage": usage,
    }


USAGE = {"prompt_tokens": 3, "completion_tokens": 2}


def assert_well_formed(events: list[ModelEvent]) -> None:
    assert isinstance(events[0], Started)
    assert [type(e) for e in events[-2:]] == [UsageReported, Done]
    assert sum(isinstance(e, UsageReported | Done | Started) for e in events) == 3
    assert sum(isinstance(e, ThinkingEnded) for e in events) <= 1


# --- local fixtures ------------------------------------------------------------------------


def test_text_usage() -> None:
    events = parse(fixture("text_usage.sse"))
    assert events == [
        Started(),
        TextDelta("Hello"),
        TextDelta(", wörld"),
        TextDelta(" ✓"),
        UsageReported(Usage(20, 4, cache_read_tokens=8, reasoning_tokens=0)),
        Done("stop"),
    ]


def test_reasoning_then_text_with_usage_on_finish_chunk() -> None:
    events = parse(fixture("reasoning_text.sse"))
    assert events == [
        Started(),
        ThinkingDelta("Think"),
        ThinkingDelta('ing "hard".'),
        ThinkingEnded(),
        TextDelta("Answer"),
        TextDelta("."),
        UsageReported(Usage(7, 9, cache_read_tokens=0, reasoning_tokens=5)),
        Done("stop", ReplayState("openai_chat", '{"reasoning_content":"Thinking \\"hard\\"."}')),
    ]


def test_parallel_tool_calls_keyed_by_index() -> None:
    events = parse(fixture("parallel_tools.sse"))
    assert events == [
        Started(),
        ToolCallStarted(0, "call_a", "read_file"),
        ToolCallArgsDelta(0, '{"path": '),
        ToolCallStarted(1, "call_b", "grep"),
        ToolCallArgsDelta(1, '{"pattern":'),
        ToolCallArgsDelta(0, '"a.py"}'),
        ToolCallArgsDelta(1, ' "fé"}'),
        ToolCallEnded(0, '{"path": "a.py"}'),
        ToolCallEnded(1, '{"pattern": "fé"}'),
        UsageReported(Usage(100, 30)),
        Done("tool_use"),
    ]


def test_whole_call_in_one_chunk_finish_stop_without_done() -> None:
    # finish "stop" with streamed calls is a tool turn; usage + finish but no [DONE] is complete.
    events = parse(fixture("whole_call_stop_no_done.sse"))
    assert events == [
        Started(),
        ToolCallStarted(0, "call_x", "ls"),
        ToolCallArgsDelta(0, '{"dir":"."}'),
        ToolCallEnded(0, '{"dir":"."}'),
        UsageReported(Usage(11, 6)),
        Done("tool_use"),
    ]


def test_keepalives_groq_reasoning_and_multiline_data() -> None:
    events = parse(fixture("keepalive.sse"))
    assert events[:5] == [
        Started(),
        ThinkingDelta("hmm"),
        ThinkingEnded(),
        TextDelta("Hi"),
        TextDelta(" there"),
    ]
    assert events[-2:] == [UsageReported(Usage(3, 2, reasoning_tokens=1)), Done("stop", events[-1].replay)]
    assert events[-1].replay == ReplayState("openai_chat", '{"reasoning_content":"hmm"}')


def test_crlf_line_endings() -> None:
    raw = fixture("crlf.sse")
    assert b"\r\n" in raw
    assert parse(raw) == [
        Started(),
        TextDelta("Line"),
        TextDelta(" two"),
        UsageReported(Usage(2, 2)),
        Done("stop"),
    ]
    assert parse(raw.replace(b"\r\n", b"\r")) == parse(raw)


def test_finish_length_is_an_error() -> None:
    with pytest.raises(ProviderError, match=r"finish_reason=length") as e:
        parse(fixture("finish_length.sse"))
    assert not e.value.retryable
    assert e.value.output_limit  # the run's error then names max_output_tokens


def test_error_chunk_inside_a_200_stream() -> None:
    with pytest.raises(ProviderError, match="Upstream went away") as e:
        parse(fixture("error_chunk.sse"))
    assert e.value.status == 502 and e.value.retryable


def test_named_error_event_then_close() -> None:
    with pytest.raises(ProviderError, match="Tool call validation failed") as e:
        parse(fixture("error_event.sse"))
    assert e.value.status == 400 and not e.value.retryable


LOCAL_OK = ["text_usage.sse", "reasoning_text.sse", "parallel_tools.sse", "whole_call_stop_no_done.sse",
            "keepalive.sse", "crlf.sse"]  # fmt: skip


@pytest.mark.parametrize("name", LOCAL_OK)
def test_byte_by_byte_equals_whole(name: str) -> None:
    raw = fixture(name)
    whole = parse(raw)
    assert_well_formed(whole)
    assert parse(*(raw[i : i + 1] for i in range(len(raw)))) == whole


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(LOCAL_OK), cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=30))
def test_arbitrary_chunking_does_not_change_events(name: str, cuts: list[int]) -> None:
    raw = fixture(name)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert parse(*pieces) == parse(raw)


# --- shared recorded fixtures (optional) ---------------------------------------------------

SHARED_FILES = sorted(SHARED.glob("*.sse")) if SHARED.is_dir() else []


@pytest.mark.parametrize("path", SHARED_FILES or [None], ids=lambda p: p.name if p else "absent")
def test_shared_recorded_fixture(path: Path | None) -> None:
    if path is None:
        pytest.skip(f"{SHARED} not present")
    raw = path.read_bytes()
    if "length" in path.name or "error" in path.name:
        with pytest.raises(ProviderError):
            parse(raw)
        return
    events = parse(raw)
    assert_well_formed(events)
    assert parse(*(raw[i : i + 97] for i in range(0, len(raw), 97))) == events
    ended = [e for e in events if isinstance(e, ToolCallEnded)]
    for e in ended:
        json.loads(e.arguments)
    assert events[-1].reason == ("tool_use" if ended else "stop")


# --- parser edge cases ---------------------------------------------------------------------


def test_thinking_ended_by_first_tool_call_and_finish() -> None:
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}
    events = parse(
        sse(
            chunk({"reasoning_content": "r"}),
            chunk({"tool_calls": [call]}),
            chunk({}, "tool_calls", USAGE),
            b"[DONE]",
        )
    )
    assert events[1:4] == [ThinkingDelta("r"), ThinkingEnded(), ToolCallStarted(0, "c", "f")]
    events = parse(sse(chunk({"reasoning": "r"}), chunk({}, "stop", USAGE), b"[DONE]"))
    assert events[1:3] == [ThinkingDelta("r"), ThinkingEnded()]


def test_tool_call_fragment_without_id_name_or_index() -> None:
    for frag in ({"index": 0, "function": {"arguments": "{}"}}, {"id": "c", "function": {"name": "f"}},
                 {"index": 0, "id": "c", "function": {}}):  # fmt: skip
        with pytest.raises(ProviderError, match="tool call"):
            parse(sse(chunk({"tool_calls": [frag]})))


@pytest.mark.parametrize("finish", ["content_filter", "function_call", "weird"])
def test_other_finish_reasons_fail(finish: str) -> None:
    with pytest.raises(ProviderError, match=finish):
        parse(sse(chunk({"content": "x"}), chunk({}, finish, USAGE), b"[DONE]"))


def test_last_finish_reason_and_last_usage_win() -> None:
    later = {"prompt_tokens": 9, "completion_tokens": 8}
    events = parse(
        sse(chunk({"content": "x"}, "length"), chunk({}, "stop", USAGE), chunk(None, usage=later), b"[DONE]")
    )
    assert events[-2:] == [UsageReported(Usage(9, 8)), Done("stop")]


def test_missing_usage_is_an_error() -> None:
    with pytest.raises(ProviderError, match="usage"):
        parse(sse(chunk({"content": "x"}), chunk({}, "stop"), b"[DONE]"))
    with pytest.raises(ProviderError, match="usage"):
        parse(sse(chunk({"content": "x"}), chunk({}, "stop")))


def test_truncation_and_bad_json() -> None:
    with pytest.raises(ProviderError, match="before finish"):
        parse(sse(chunk({"content": "x"})))
    with pytest.raises(ProviderError, match="mid-event"):
        parse(sse(chunk({"content": "x"})) + b'data: {"choi')
    with pytest.raises(ProviderError, match="before finish"):
        parse(sse(chunk({"content": "x"}), b"[DONE]"))
    with pytest.raises(ProviderError, match="invalid JSON"):
        parse(b"data: {nope}\n\n")


def test_nothing_after_done_matters() -> None:
    events = parse(sse(chunk({"content": "x"}, "stop", USAGE), b"[DONE]", b"{bad"))
    assert events[-1] == Done("stop")


def test_refusal_is_text() -> None:
    events = parse(sse(chunk({"content": None, "refusal": "I can't"}), chunk({}, "stop", USAGE), b"[DONE]"))
    assert TextDelta("I can't") in events


# --- http_error ----------------------------------------------------------------------------


def test_http_error() -> None:
    e = http_error(429, b'{"error":{"message":"Rate limit reached","type":"rate_limit"}}', "7")
    assert (e.status, e.retryable, e.retry_after_s) == (429, True, 7.0)
    assert "429" in e.message and "Rate limit reached" in e.message
    e = http_error(400, b'[{"error":{"message":"bad field"}}]', None)
    assert (e.retryable, e.retry_after_s) == (False, None) and "bad field" in e.message
    assert http_error(503, b"<html>down</html>", "Wed, 21 Oct 2015 07:28:00 GMT").retryable
    assert http_error(503, b"", "soon").retry_after_s is None
    assert "oops" in http_error(401, b'{"message":"oops"}', None).message
    assert [http_error(s, b"", None).retryable for s in (408, 425, 500, 599, 401, 404)] == [True] * 4 + [
        False
    ] * 2


# --- build_request -------------------------------------------------------------------------

TOOL = ToolSpec("read_file", "Read a file", '{"properties":{"path":{"type":"string"}},"type":"object"}')
CALL = ToolCall("call_1", "read_file", '{"path": "a.py"}', 0)
REPLAY = ReplayState("openai_chat", '{"reasoning_content":"because"}')


def request(*history, **settings) -> ModelRequest:
    return ModelRequest("Be brief.", (TOOL,), tuple(history), ModelSettings("gpt-x", **settings))


def test_build_request_exact_json() -> None:
    req = request(
        UserTurn("hi é"),
        AssistantTurn("Let me look.", "because", REPLAY, (CALL,)),
        ToolResultTurn("call_1", "read_file", "print(1)"),
        AssistantTurn("Done."),
        max_output_tokens=100,
        extra_body=(("temperature", 0),),
    )
    assert (
        build_request(req)
        == (
            '{"model":"gpt-x","stream":true,"stream_options":{"include_usage":true},"messages":['
            '{"role":"system","content":"Be brief."},'
            '{"role":"user","content":"hi é"},'
            '{"role":"assistant","content":"Let me look.","reasoning_content":"because","tool_calls":['
            '{"id":"call_1","type":"function","function":{"name":"read_file",'
            '"arguments":"{\\"path\\": \\"a.py\\"}"}}]},'
            '{"role":"tool","tool_call_id":"call_1","content":"print(1)"},'
            '{"role":"assistant","content":"Done."}],'
            '"tools":[{"type":"function","function":{"name":"read_file","description":"Read a file",'
            '"parameters":{"properties":{"path":{"type":"string"}},"type":"object"}}}],'
            '"max_tokens":100,"temperature":0}'
        ).encode()
    )
    assert build_request(req) == build_request(
        request(*req.history, max_output_tokens=100, extra_body=(("temperature", 0),))
    )


def test_build_request_minimal() -> None:
    req = ModelRequest("", (), (UserTurn("x"), AssistantTurn("", tool_calls=(CALL,))), ModelSettings("m"))
    body = json.loads(build_request(req))
    assert list(body) == ["model", "stream", "stream_options", "messages"]
    assert body["messages"][0] == {"role": "user", "content": "x"}
    assert body["messages"][1]["content"] is None
    assert "reasoning_content" not in body["messages"][1]


def _messages_bytes(body: bytes) -> bytes:
    text = body.decode()
    start = text.index('"messages":') + len('"messages":')
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end].encode()


def test_messages_prefix_property() -> None:
    h1 = (
        UserTurn("a"),
        AssistantTurn("t", "because", REPLAY, (CALL,)),
        ToolResultTurn("call_1", "read_file", "r"),
    )
    h2 = (*h1, AssistantTurn("done"), UserTurn("again"))
    m1, m2 = _messages_bytes(build_request(request(*h1))), _messages_bytes(build_request(request(*h2)))
    assert m1.endswith(b"]") and m2.startswith(m1[:-1] + b",")


def test_reasoning_replay_rules() -> None:
    def reasoning(turn: AssistantTurn, **settings) -> str | None:
        return json.loads(build_request(request(UserTurn("u"), turn, **settings)))["messages"][2].get(
            "reasoning_content"
        )

    assert reasoning(AssistantTurn("", "because", REPLAY, (CALL,))) == "because"
    assert (
        reasoning(AssistantTurn("", "because", REPLAY, (CALL,)), replay_reasoning_on_tool_turns=False) is None
    )
    assert reasoning(AssistantTurn("text only", "because", REPLAY)) is None  # no tool calls
    other = ReplayState("anthropic", '{"reasoning_content":"x"}')
    assert reasoning(AssistantTurn("", "because", other, (CALL,))) is None  # another adapter's state
    assert reasoning(AssistantTurn("", "because", None, (CALL,))) is None
