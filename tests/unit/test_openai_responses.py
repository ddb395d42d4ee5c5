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
from byok.providers.openai_responses_request import build_request
from byok.providers.openai_responses_stream import ResponsesStreamParser
from tests.support.provider_fixtures import own_fixtures, parse_all, shared_fixtures

FIXTURES = own_fixtures("openai_responses")
SHARED = shared_fixtures("openai_responses")  # absent on a fresh clone


def parse(*chunks: bytes) -> list[ModelEvent]:
    return parse_all(ResponsesStreamParser, chunks)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sse(*objs: Any) -> bytes:
    return b"".join(
        (b"data: " + o + b"\n\n") if isinstance(o, bytes) else
        f"event: {o['type']}\ndata: {json.dumps(o)}\n\n".encode()
        for o in objs
    )  # fmt: skip


CREATED = {"type": "response.created", "response": {"status": "in_progress", "usage": None}}
USAGE = {"input_tokens": 3, "output_tokens": 2}
COMPLETED = {"type": "response.completed", "response": {"status": "completed", "usage": USAGE}}


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def replay_items(events: list[ModelEvent]) -> list[dict[str, Any]]:
    last = events[-1]
    assert isinstance(last, Done) and last.replay is not None
    assert last.replay.provider_kind == "openai_responses"
    return json.loads(last.replay.data)["items"]


def assert_well_formed(events: list[ModelEvent]) -> None:
    assert isinstance(events[0], Started)
    assert [type(e) for e in events[-2:]] == [UsageReported, Done]
    assert sum(isinstance(e, UsageReported | Done | Started) for e in events) == 3


# --- local fixtures ------------------------------------------------------------------------


def test_text_with_cached_and_cache_write_tokens() -> None:
    assert parse(fixture("text_usage.sse")) == [
        Started(),
        TextDelta("Hello"),
        TextDelta(", wörld ✓"),
        UsageReported(Usage(2000, 7, cache_read_tokens=1536, cache_write_tokens=64, reasoning_tokens=0)),
        Done(
            "stop",
            ReplayState(
                "openai_responses",
                '{"items":[{"id":"msg_1","phase":"final_answer","text":"Hello, wörld ✓","type":"message"}]}',
            ),
        ),
    ]


def test_reasoning_summary_message_and_parallel_calls() -> None:
    events = parse(fixture("reasoning_tools.sse"))
    assert events[:-1] == [
        Started(),
        ThinkingDelta("**Plan**"),
        ThinkingDelta("\n\n"),  # between summary parts
        ThinkingDelta("Read both files."),
        ThinkingEnded(),
        TextDelta("Reading."),
        ToolCallStarted(0, "call_a", "read_file"),
        ToolCallArgsDelta(0, '{"path":'),
        ToolCallArgsDelta(0, ' "a.py"}'),
        ToolCallStarted(1, "call_b", "read_file"),
        ToolCallArgsDelta(1, '{"path": "b.py"}'),
        ToolCallEnded(0, '{"path": "a.py"}'),
        ToolCallEnded(1, '{"path": "b.py"}'),
        UsageReported(Usage(300, 120, cache_read_tokens=0, reasoning_tokens=64)),
    ]
    assert events[-1].reason == "tool_use"
    assert replay_items(events) == [
        {
            "type": "reasoning",
            "id": "rs_1",
            # encrypted_content changes between added and done; done wins.
            "encrypted_content": "enc-final",
            "summary": [
                {"type": "summary_text", "text": "**Plan**"},
                {"type": "summary_text", "text": "Read both files."},
            ],
        },
        {"type": "message", "id": "msg_2", "text": "Reading."},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "read_file",
         "arguments": '{"path": "a.py"}'},
        {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "read_file",
         "arguments": '{"path": "b.py"}'},
    ]  # fmt: skip


def test_raw_reasoning_done_out_of_order_keepalive_and_done_sentinel() -> None:
    events = parse(fixture("raw_reasoning_done_sentinel.sse"))
    assert events[:-1] == [
        Started(),
        ThinkingDelta("Two plus"),
        ThinkingDelta(" two."),
        ThinkingEnded(),  # when the message starts, not when the reasoning item is done later
        TextDelta("4"),
        UsageReported(Usage(20, 6, cache_read_tokens=0, reasoning_tokens=4)),
    ]
    # Items are kept in output order, whatever order their done events came in.
    assert replay_items(events) == [
        {"type": "reasoning", "id": "rs_tmp_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Two plus two."}]},
        {"type": "message", "id": "msg_tmp_1", "text": "4"},
    ]  # fmt: skip


def test_incomplete_names_the_reason() -> None:
    with pytest.raises(ProviderError, match="max_output_tokens") as e:
        parse(fixture("incomplete_max_output.sse"))
    assert not e.value.retryable
    assert e.value.output_limit


def test_failed_and_error_events() -> None:
    with pytest.raises(ProviderError, match=r"hiccup.*server_error") as e:
        parse(fixture("failed_server_error.sse"))
    assert e.value.retryable
    with pytest.raises(ProviderError, match=r"Slow down.*rate_limit_exceeded") as e:
        parse(fixture("error_legacy_shape.sse"))
    assert e.value.retryable
    with pytest.raises(ProviderError, match=r"exceeds the context window.*context_length_exceeded") as e:
        parse(fixture("error_nested_shape.sse"))
    assert not e.value.retryable
    with pytest.raises(ProviderError, match="without an error"):
        parse(sse(CREATED, {"type": "response.failed", "response": {"error": None}}))


def test_truncation() -> None:
    with pytest.raises(ProviderError, match=r"mid-event before response\.completed"):
        parse(fixture("truncated.sse"))
    whole = fixture("text_usage.sse")
    cut = whole[: whole.index(b"event: response.completed")]
    with pytest.raises(ProviderError, match=r"before response\.completed"):
        parse(cut)
    with pytest.raises(ProviderError, match=r"\[DONE\] before response.completed"):
        parse(sse(CREATED, b"[DONE]"))
    with pytest.raises(ProviderError, match=r"before response\.completed"):
        parse(b"")


LOCAL_OK = ["text_usage.sse", "reasoning_tools.sse", "raw_reasoning_done_sentinel.sse"]


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

# name -> (expected reason or error pattern, replay item types); only structure is asserted.
SHARED_EXPECTED: dict[str, tuple[str, list[str]]] = {
    "deepseek-responses-reasoning-text.sse": ("stop", ["reasoning", "message"]),
    "openai-gpt4o-function-call.sse": ("tool_use", ["function_call"]),
    "openai-gpt5-reasoning-encrypted-function-call.sse": ("tool_use", ["reasoning", "function_call"]),
    "openai-gpt52-text.sse": ("stop", ["message"]),
    "openai-gpt54-text-cached-tokens.sse": ("stop", ["message"]),
    "openai-gpt5nano-error-insufficient-quota.sse": ("error:insufficient_quota", []),
    "openai-o3mini-reasoning-summary.sse": ("stop", ["reasoning", "message"]),
    "openrouter-gptoss-responses-reasoning-done-sentinel.sse": ("stop", ["reasoning", "message"]),
}
SHARED_FILES = sorted(SHARED.glob("*.sse")) if SHARED.is_dir() else []


@pytest.mark.parametrize("path", SHARED_FILES or [None], ids=lambda p: p.name if p else "absent")
def test_shared_recorded_fixture(path: Path | None) -> None:
    if path is None:
        pytest.skip(f"{SHARED} not present")
    raw = path.read_bytes()
    expected, types = SHARED_EXPECTED.get(path.name, ("error" if "error" in path.name else "", []))
    if expected.startswith("error"):
        with pytest.raises(ProviderError, match=expected.partition(":")[2]):
            parse(raw)
        return
    events = parse(raw)
    assert_well_formed(events)
    assert parse(*(raw[i : i + 97] for i in range(0, len(raw), 97))) == events
    ended = [e for e in events if isinstance(e, ToolCallEnded)]
    for e in ended:
        json.loads(e.arguments)
    assert events[-1].reason == ("tool_use" if ended else "stop")
    if expected:
        assert events[-1].reason == expected
        assert [i["type"] for i in replay_items(events)] == types
    # Replay text is exactly what was streamed; encrypted content is the output_item.done one.
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    items = replay_items(events)
    assert "".join(i.get("text", "") for i in items if i["type"] == "message") == text
    done_items = {
        o["item"]["id"]: o["item"]
        for o in (json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {"))
        if o.get("type") == "response.output_item.done"
    }
    for item in items:
        if item["type"] == "reasoning":
            assert item.get("encrypted_content") == done_items[item["id"]].get("encrypted_content")
            assert item["summary"] == done_items[item["id"]]["summary"]


def test_shared_cached_tokens_fixture() -> None:
    path = SHARED / "openai-gpt54-text-cached-tokens.sse"
    if not path.exists():
        pytest.skip(f"{path} not present")
    usage = parse(path.read_bytes())[-2]
    assert isinstance(usage, UsageReported)
    assert usage.usage.cache_read_tokens and usage.usage.cache_write_tokens == 0


# --- parser edge cases ---------------------------------------------------------------------


def test_function_call_without_call_id_or_name() -> None:
    for item in ({"type": "function_call", "id": "fc", "name": "f"},
                 {"type": "function_call", "id": "fc", "call_id": "c", "name": ""}):  # fmt: skip
        with pytest.raises(ProviderError, match="call_id and name"):
            parse(sse(CREATED, added(0, item)))


def test_deltas_for_items_never_added() -> None:
    with pytest.raises(ProviderError, match="never added"):
        parse(sse(CREATED, {"type": "response.output_text.delta", "output_index": 3, "delta": "x"}))
    with pytest.raises(ProviderError, match="never added"):
        parse(sse(CREATED, {"type": "response.function_call_arguments.delta", "item_id": "fc", "delta": "{"}))


def test_bad_json_and_non_object() -> None:
    with pytest.raises(ProviderError, match="invalid JSON"):
        parse(b"data: {nope}\n\n")
    with pytest.raises(ProviderError, match="unexpected stream event"):
        parse(b"data: [1]\n\n")


def test_completed_without_usage_is_an_error() -> None:
    with pytest.raises(ProviderError, match="without usage"):
        parse(sse(CREATED, {"type": "response.completed", "response": {"usage": None}}))


def test_unknown_events_ignored_and_whole_items_without_added_or_deltas() -> None:
    call = {"type": "function_call", "id": "fc", "call_id": "c1", "name": "ls", "arguments": '{"d":1}'}
    msg = {"type": "message", "id": "m", "content": [{"type": "refusal", "refusal": "No."}]}
    events = parse(
        sse(
            CREATED,
            {"type": "response.some_future_event", "output_index": 0},
            {"type": "response.output_text.annotation.added", "output_index": 0},
            done(0, msg),  # no added event, text only in the done item
            done(1, call),
            COMPLETED,
            b"[DONE]",
            b"{ignored after completion",
        )
    )
    assert events[:-1] == [
        Started(),
        TextDelta("No."),
        ToolCallStarted(0, "c1", "ls"),
        ToolCallArgsDelta(0, '{"d":1}'),
        ToolCallEnded(0, '{"d":1}'),
        UsageReported(Usage(3, 2)),
    ]
    assert [i["type"] for i in replay_items(events)] == ["message", "function_call"]


def test_refusal_deltas_are_text_and_unknown_items_are_kept_verbatim() -> None:
    other = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    events = parse(
        sse(
            CREATED,
            added(0, other),
            done(0, other),
            added(1, {"type": "message", "id": "m"}),
            {"type": "response.refusal.delta", "output_index": 1, "delta": "I can't."},
            COMPLETED,
        )
    )
    assert TextDelta("I can't.") in events and events[-1].reason == "stop"
    assert replay_items(events) == [
        {"type": "web_search_call", "item": other},
        {"type": "message", "id": "m", "text": "I can't."},
    ]


def test_args_done_overrides_and_empty_output_has_no_replay() -> None:
    call = {"type": "function_call", "id": "fc", "call_id": "c1", "name": "ls", "arguments": ""}
    events = parse(
        sse(
            CREATED,
            added(0, call),
            {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"a"'},
            {"type": "response.function_call_arguments.done", "output_index": 0, "arguments": '{"a":2}'},
            COMPLETED,
        )
    )
    assert ToolCallEnded(0, '{"a":2}') in events
    assert parse(sse(CREATED, COMPLETED))[-1] == Done("stop", None)


# --- build_request -------------------------------------------------------------------------

TOOL = ToolSpec("read_file", "Read a file", '{"properties":{"path":{"type":"string"}},"type":"object"}')
CALL = ToolCall("call_1", "read_file", '{"path": "a.py"}', 0)


def request(*history: Any, system: str = "Be brief.", **settings: Any) -> ModelRequest:
    return ModelRequest(system, (TOOL,), tuple(history), ModelSettings("gpt-x", **settings))


def test_build_request_exact_json_without_replay() -> None:
    other = ReplayState("openai_chat", '{"reasoning_content":"because"}')
    req = request(
        UserTurn("hi é"),
        AssistantTurn("Let me look.", "because", other, (CALL,)),  # another kind's state is ignored
        ToolResultTurn("call_1", "read_file", "print(1)", is_error=True),
        AssistantTurn("Done."),
        max_output_tokens=100,
        extra_body=(("reasoning", {"effort": "high"}),),
    )
    assert (
        build_request(req)
        == (
            '{"model":"gpt-x","stream":true,"store":false,"include":["reasoning.encrypted_content"],'
            '"instructions":"Be brief.","input":['
            '{"role":"user","content":"hi é"},'
            '{"role":"assistant","content":"Let me look."},'
            '{"type":"function_call","call_id":"call_1","name":"read_file",'
            '"arguments":"{\\"path\\": \\"a.py\\"}"},'
            '{"type":"function_call_output","call_id":"call_1","output":"print(1)"},'
            '{"role":"assistant","content":"Done."}],'
            '"tools":[{"type":"function","name":"read_file","description":"Read a file",'
            '"parameters":{"properties":{"path":{"type":"string"}},"type":"object"},"strict":false}],'
            '"max_output_tokens":100,"reasoning":{"effort":"high"}}'
        ).encode()
    )


def test_build_request_minimal() -> None:
    req = ModelRequest("", (), (UserTurn("x"), AssistantTurn("")), ModelSettings("m"))
    body = json.loads(build_request(req))
    assert list(body) == ["model", "stream", "store", "include", "input"]
    assert body["input"] == [{"role": "user", "content": "x"}]  # an empty turn sends nothing
    assert "previous_response_id" not in build_request(req).decode()


def _input_bytes(body: bytes) -> bytes:
    text = body.decode()
    start = text.index('"input":') + len('"input":')
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end].encode()


def test_input_prefix_property() -> None:
    events = parse(fixture("reasoning_tools.sse"))
    replay = events[-1].replay
    calls = (CALL, ToolCall("call_b", "read_file", '{"path": "b.py"}', 1))
    h1 = (
        UserTurn("a"),
        AssistantTurn("Reading.", "t", replay, calls),
        ToolResultTurn("call_1", "read_file", "r1"),
        ToolResultTurn("call_b", "read_file", "r2"),
    )
    h2 = (*h1, AssistantTurn("done"), UserTurn("again"))
    i1, i2 = _input_bytes(build_request(request(*h1))), _input_bytes(build_request(request(*h2)))
    assert i1.endswith(b"]") and i2.startswith(i1[:-1] + b",")


SAVED = ReplayState(
    "openai_responses",
    json.dumps(
        {
            "items": [
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E1"},
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "ls", "arguments": "{}"},
                {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "E2"},
                {"type": "message", "id": "m1", "text": "Hi", "phase": "commentary"},
                {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "cat", "arguments": "{}"},
                {"type": "custom_item", "item": {"type": "custom_item", "id": "x"}},
            ]
        }
    ),
)


def assistant_input(turn: AssistantTurn) -> list[dict[str, Any]]:
    return json.loads(build_request(request(turn)))["input"]


def test_replay_drops_unanswered_calls_and_the_reasoning_before_them() -> None:
    # Projection keeps only calls with results: c1 was never answered.
    turn = AssistantTurn("Hi", "", SAVED, (ToolCall("c2", "cat", '{"f": 1}', 1),))
    assert assistant_input(turn) == [
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "E2"},
        {"type": "message", "role": "assistant", "id": "m1",
         "content": [{"type": "output_text", "text": "Hi"}], "phase": "commentary"},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "cat", "arguments": '{"f": 1}'},
        {"type": "custom_item", "id": "x"},
    ]  # fmt: skip


def test_replay_with_diverging_text_or_unknown_calls_keeps_the_turns_values() -> None:
    extra = ToolCall("c9", "grep", "{}", 2)
    turn = AssistantTurn("Other", "", SAVED, (ToolCall("c1", "ls", "{}", 0), extra))
    assert [i.get("id", i.get("call_id", i.get("content"))) for i in assistant_input(turn)] == [
        "rs_1", "fc_1", "rs_2", "Other", "x", "c9",  # the turn's text takes the first message's place
    ]  # fmt: skip
    garbage = AssistantTurn("t", "", ReplayState("openai_responses", "not json"), ())
    assert assistant_input(garbage) == [{"role": "assistant", "content": "t"}]
    no_calls_before_text = AssistantTurn(
        "late", "", ReplayState("openai_responses", '{"items":[{"type":"reasoning","id":"r","summary":[]}]}')
    )
    assert assistant_input(no_calls_before_text) == [
        {"type": "reasoning", "id": "r", "summary": []},
        {"role": "assistant", "content": "late"},
    ]
