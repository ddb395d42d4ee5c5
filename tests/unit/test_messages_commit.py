"""Turn commit, model side: a large text is escaped once and spliced into every JSON encoding, the
result is byte-identical to encoding everything, and decodes_to_itself implies decode(encode) == m."""

from __future__ import annotations

import json
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from byok.cursor.root_json import encode_root
from byok.model.messages import (
    _HOLE,
    SPLICE_MIN,
    Message,
    ReplayState,
    ToolCall,
    canonical_json,
    splice_json,
)

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
# A short random text repeated past the splice threshold, sometimes with the hole string in it.
large_texts = st.builds(
    lambda s, hole: (s or "x") * (SPLICE_MIN // max(len(s), 1) + 1) + (_HOLE if hole else ""),
    texts,
    st.booleans(),
)
any_texts = texts | large_texts | st.just(_HOLE)
messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    origin=st.sampled_from(["user", "runtime", "assistant", "tool"]),
    text=any_texts,
    thinking=texts | st.just(_HOLE),
    replay=st.none() | st.builds(ReplayState, provider_kind=texts, data=texts),
    tool_calls=st.lists(
        st.builds(ToolCall, call_id=texts, name=texts, arguments=texts, index=st.integers(-5, 1000)),
        max_size=3,
    ).map(tuple),
    tool_call_id=texts | st.just(_HOLE),
    tool_name=texts,
    is_error=st.booleans(),
    tool_round_id=texts,
    completion_seq=st.integers(-3, 10**12),
    event_id=texts | st.just(_HOLE),
    model_call_id=texts,
)


def reference_encode_root(message: Message) -> bytes:
    """root_json.encode_root before the splice (git history), kept as the oracle."""
    content: Any
    if message.role == "assistant":
        parts: list[dict[str, Any]] = []
        if message.thinking:
            parts.append({"type": "reasoning", "text": message.thinking})
        if message.text:
            parts.append({"type": "text", "text": message.text})
        for c in message.tool_calls:
            parts.append(
                {"type": "tool-call", "toolCallId": c.call_id, "toolName": c.name, "input": c.arguments}
            )
        content = parts
    elif message.role == "tool":
        content = [
            {
                "type": "tool-result",
                "toolCallId": message.tool_call_id,
                "toolName": message.tool_name,
                "output": {"type": "error-text" if message.is_error else "text", "value": message.text},
            }
        ]
    else:
        content = message.text
    byok: dict[str, Any] = {"origin": message.origin}
    if message.replay is not None:
        byok["replay"] = {"provider_kind": message.replay.provider_kind, "data": message.replay.data}
    if message.tool_calls:
        byok["call_index"] = [c.index for c in message.tool_calls]
    for key in ("tool_round_id", "event_id", "model_call_id"):
        value = getattr(message, key)
        if value:
            byok[key] = value
    if message.completion_seq:
        byok["completion_seq"] = message.completion_seq
    return canonical_json({"role": message.role, "content": content, "providerOptions": {"byok": byok}})


def fresh(m: Message) -> Message:
    """The same message without memoised encodings."""
    return attrs.evolve(m)


@settings(max_examples=300)
@given(messages)
def test_encode_is_canonical_json_of_the_fields(m: Message) -> None:
    assert m.encode() == canonical_json(m.to_json_obj())


@settings(max_examples=300)
@given(messages)
def test_text_json_is_the_json_of_the_text(m: Message) -> None:
    m.encode()
    assert bytes(m.text_json()) == json.dumps(m.text, ensure_ascii=False).encode()
    assert bytes(fresh(m).text_json()) == json.dumps(m.text, ensure_ascii=False).encode()


@settings(max_examples=300)
@given(messages)
def test_root_json_splices_the_same_bytes(m: Message) -> None:
    expected = reference_encode_root(m)
    assert encode_root(fresh(m)) == expected  # text escaped by the root itself
    m.encode()
    assert encode_root(m) == expected  # text spliced from encode()


@settings(max_examples=300)
@given(messages)
def test_decodes_to_itself_means_decode_inverts_encode(m: Message) -> None:
    assert m.decodes_to_itself()  # every generated field has its declared type
    assert Message.decode(m.encode()) == m


def test_badly_typed_messages_are_not_claimed_to_round_trip() -> None:
    ok = Message(role="tool", origin="tool", text="t", tool_calls=(ToolCall("c", "n", "{}", 0),))
    assert ok.decodes_to_itself()
    bad = [
        attrs.evolve(ok, text=None),  # type: ignore[arg-type]
        attrs.evolve(ok, tool_calls=[ToolCall("c", "n", "{}", 0)]),  # type: ignore[arg-type]
        attrs.evolve(ok, is_error=0),  # type: ignore[arg-type]
        attrs.evolve(ok, completion_seq=True),
        attrs.evolve(ok, completion_seq=1.0),  # type: ignore[arg-type]
        attrs.evolve(ok, tool_calls=(ToolCall("c", "n", "{}", True),)),
        attrs.evolve(ok, replay=ReplayState("k", None)),  # type: ignore[arg-type]
        attrs.evolve(ok, tool_name=type("S", (str,), {})("x")),
    ]
    for m in bad:
        assert not m.decodes_to_itself(), m


def test_a_hole_elsewhere_falls_back_to_encoding_everything() -> None:
    text = "y" * SPLICE_MIN
    text_json = json.dumps(text).encode()
    assert splice_json(lambda t: {"a": _HOLE, "t": t}, text, text_json) == canonical_json(
        {"a": _HOLE, "t": text}
    )
    assert splice_json(lambda t: {"a": "b", "t": t}, text, text_json) == canonical_json({"a": "b", "t": text})
    m = Message(role="user", origin="user", text=text, event_id=_HOLE)
    assert m.encode() == canonical_json(m.to_json_obj())
    assert m.memo_get("text_span") is None  # no span: text_json() escapes the text itself
    assert m.text_json() == text_json


def test_large_text_is_escaped_once() -> None:
    m = Message(role="tool", origin="tool", text='line "1"\n\tline 2\u2028é\x00\n' * 2000, tool_call_id="c")
    data = m.encode()
    view = m.text_json()
    assert isinstance(view, memoryview) and view.obj is data  # a view into encode(), not a copy
    assert encode_root(m) == reference_encode_root(m)
