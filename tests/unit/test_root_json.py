"""Root JSON messages: encode_root/decode_root round-trip every canonical Message shape."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor.root_json import RootJsonError, decode_root, encode_root
from byok.model.messages import Message, ReplayState, ToolCall

# -- a strategy for every canonical Message shape --------------------------------------------------

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_:", max_size=12)
nonempty_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_:", min_size=1, max_size=12)

replays = st.builds(ReplayState, provider_kind=st.sampled_from(["anthropic", "openai-chat", "x"]), data=texts)


@st.composite
def tool_calls(draw: st.DrawFn) -> tuple[ToolCall, ...]:
    n = draw(st.integers(0, 4))
    indexes = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n, unique=True))
    call_ids = draw(st.lists(nonempty_ids, min_size=n, max_size=n, unique=True))
    return tuple(
        ToolCall(call_id, draw(nonempty_ids), draw(texts), index)
        for call_id, index in zip(call_ids, indexes, strict=True)
    )


system_messages = st.builds(Message, role=st.just("system"), origin=st.just("runtime"), text=texts)
user_messages = st.builds(
    Message,
    role=st.just("user"),
    origin=st.sampled_from(["user", "runtime"]),
    text=texts,
    event_id=ids,
)
assistant_messages = st.builds(
    Message,
    role=st.just("assistant"),
    origin=st.just("assistant"),
    text=texts,
    thinking=texts,
    replay=st.none() | replays,
    tool_calls=tool_calls(),
    tool_round_id=ids,
    event_id=ids,
    model_call_id=ids,
)
tool_messages = st.builds(
    Message,
    role=st.just("tool"),
    origin=st.just("tool"),
    text=texts,
    tool_call_id=nonempty_ids,
    tool_name=nonempty_ids,
    is_error=st.booleans(),
    tool_round_id=ids,
    completion_seq=st.integers(0, 10**6),
    event_id=ids,
)
messages = st.one_of(system_messages, user_messages, assistant_messages, tool_messages)


# -- round trip and determinism --------------------------------------------------------------------


@given(messages)
def test_decode_inverts_encode(m: Message) -> None:
    assert decode_root(encode_root(m)) == m


@given(messages)
def test_encoding_is_canonical_json(m: Message) -> None:
    data = encode_root(m)
    obj = json.loads(data)
    assert data == json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert obj["role"] == m.role
    # Re-encoding the decoded message gives the same bytes: the blob id is stable.
    assert encode_root(decode_root(data)) == data


@given(messages, messages)
def test_distinct_messages_encode_differently(a: Message, b: Message) -> None:
    assert (encode_root(a) == encode_root(b)) == (a == b)


def test_assistant_root_is_an_ai_sdk_message() -> None:
    m = Message(
        role="assistant",
        origin="assistant",
        text="Looking.",
        thinking="plan",
        tool_calls=(ToolCall("c1", "read", '{"p":1}', 3),),
    )
    obj = json.loads(encode_root(m))
    assert obj["content"] == [
        {"type": "reasoning", "text": "plan"},
        {"type": "text", "text": "Looking."},
        {"type": "tool-call", "toolCallId": "c1", "toolName": "read", "input": '{"p":1}'},
    ]
    assert obj["providerOptions"]["byok"]["call_index"] == [3]


@pytest.mark.parametrize(("is_error", "kind"), [(False, "text"), (True, "error-text")])
def test_tool_root_is_an_ai_sdk_tool_result(is_error: bool, kind: str) -> None:
    m = Message(
        role="tool", origin="tool", text="out", tool_call_id="c1", tool_name="read", is_error=is_error
    )
    obj = json.loads(encode_root(m))
    assert obj["role"] == "tool"
    assert obj["content"] == [
        {
            "type": "tool-result",
            "toolCallId": "c1",
            "toolName": "read",
            "output": {"type": kind, "value": "out"},
        }
    ]


def test_user_root_content_is_the_plain_text() -> None:
    obj = json.loads(encode_root(Message(role="user", origin="runtime", text="hi")))
    assert obj["content"] == "hi"
    assert obj["providerOptions"]["byok"]["origin"] == "runtime"


# -- roots written by other servers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "origin"),
    [("user", "user"), ("system", "runtime"), ("assistant", "assistant"), ("tool", "tool")],
)
def test_plain_string_root_decodes_with_defaults(role: str, origin: str) -> None:
    m = decode_root(json.dumps({"role": role, "content": "hello"}).encode())
    assert m == Message(role=role, origin=origin, text="hello")  # type: ignore[arg-type]


def test_user_root_with_text_parts() -> None:
    data = json.dumps(
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}],
        }
    ).encode()
    # An image part without its bytes is not dropped without a word (tests/unit/test_images.py).
    note = "\n[an image of the conversation was not carried over: its bytes are not in the transcript]\n"
    assert decode_root(data) == Message(role="user", origin="user", text=f"a{note}b")


def test_foreign_assistant_root_with_object_tool_input() -> None:
    data = json.dumps(
        {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": "r1"},
                {"type": "text", "text": "x"},
                {"type": "reasoning", "text": "r2"},
                {"type": "text", "text": "y"},
                {"type": "tool-call", "toolCallId": "a", "toolName": "read", "input": {"path": "é", "n": 1}},
                {"type": "tool-call", "toolCallId": "b", "toolName": "ls", "input": "{}"},
            ],
            "providerOptions": {"anthropic": {"cacheControl": {"type": "ephemeral"}}},
        }
    ).encode()
    m = decode_root(data)
    assert m.role == "assistant" and m.origin == "assistant"
    assert (m.text, m.thinking, m.replay) == ("xy", "r1r2", None)
    assert [(c.call_id, c.name, c.index) for c in m.tool_calls] == [("a", "read", 0), ("b", "ls", 1)]
    assert json.loads(m.tool_calls[0].arguments) == {"path": "é", "n": 1}
    assert m.tool_calls[1].arguments == "{}"


@pytest.mark.parametrize(
    ("output", "text", "is_error"),
    [
        ({"type": "text", "value": "ok"}, "ok", False),
        ({"type": "error-text", "value": "bad"}, "bad", True),
        ({"type": "json", "value": {"a": [1, 2]}}, '{"a":[1,2]}', False),
        ({"type": "error-json", "value": {"e": 1}}, '{"e":1}', True),
    ],
)
def test_foreign_tool_result_root(output: dict, text: str, is_error: bool) -> None:
    data = json.dumps(
        {
            "role": "tool",
            "content": [{"type": "tool-result", "toolCallId": "c", "toolName": "n", "output": output}],
        }
    ).encode()
    m = decode_root(data)
    assert m == Message(
        role="tool", origin="tool", text=text, tool_call_id="c", tool_name="n", is_error=is_error
    )


# -- malformed roots -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"null",
        b'"a string"',
        b"42",
        b'{"content": "x"}',
        b'{"role": "user"}',
        b'{"role": "wizard", "content": "x"}',
        b'{"role": "USER", "content": "x"}',
        b'{"role": ["user"], "content": "x"}',
        b'{"role": "user", "content": 5}',
        b'{"role": "user", "content": null}',
        b'{"role": "user", "content": {"type": "text", "text": "x"}}',
    ],
)
def test_malformed_root_raises_root_json_error(data: bytes) -> None:
    with pytest.raises(RootJsonError):
        decode_root(data)


def test_root_json_error_is_a_value_error() -> None:
    assert issubclass(RootJsonError, ValueError)


@pytest.mark.parametrize(
    "data",
    [
        b'{"role": "user", "content": ["hi"]}',
        b'{"role": "user", "content": "x", "providerOptions": [1]}',
        b'{"role": "user", "content": "x", "providerOptions": {"byok": "s"}}',
        b'{"role": "user", "content": "x", "providerOptions": {"byok": {"replay": "s"}}}',
        b'{"role": "assistant", "content": [{"type": "tool-call", "toolName": "n"}]}',
        b'{"role": "tool", "content": [{"type": "tool-result", "output": "oops"}]}',
    ],
)
def test_structurally_malformed_root_raises_root_json_error(data: bytes) -> None:
    with pytest.raises(RootJsonError):
        decode_root(data)
