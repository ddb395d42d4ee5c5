"""Message: canonical encoding (sorted, compact, defaults omitted), decode inverts encode, id = sha256."""

from __future__ import annotations

import hashlib
import json

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.model.messages import Message, ReplayState, ToolCall, canonical_json

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)

# Any field combination, not only the shapes the loop produces: encode/decode must be total.
any_messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    origin=st.sampled_from(["user", "runtime", "assistant", "tool"]),
    text=texts,
    thinking=texts,
    replay=st.none() | st.builds(ReplayState, provider_kind=texts, data=texts),
    tool_calls=st.lists(
        st.builds(ToolCall, call_id=texts, name=texts, arguments=texts, index=st.integers(0, 1000)),
        max_size=3,
    ).map(tuple),
    tool_call_id=texts,
    tool_name=texts,
    is_error=st.booleans(),
    tool_round_id=texts,
    completion_seq=st.integers(0, 10**9),
    event_id=texts,
    model_call_id=texts,
)

DEFAULTS = Message(role="user", origin="user")


@given(any_messages)
def test_decode_inverts_encode(m: Message) -> None:
    assert Message.decode(m.encode()) == m


@given(any_messages)
def test_encoding_is_canonical_json(m: Message) -> None:
    data = m.encode()
    obj = json.loads(data)
    assert data == json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert list(obj) == sorted(obj)


@given(any_messages)
def test_fields_at_their_default_are_omitted(m: Message) -> None:
    obj = json.loads(m.encode())
    assert obj["role"] == m.role and obj["origin"] == m.origin
    for field in attrs.fields(Message):
        if field.name in ("role", "origin") or not field.init:  # private memo, not content
            continue
        value = getattr(m, field.name)
        assert (field.name in obj) == (value != field.default), field.name


@given(any_messages)
def test_id_is_sha256_of_the_encoding(m: Message) -> None:
    assert m.id == hashlib.sha256(m.encode()).digest()
    assert len(m.id) == 32


@given(any_messages, any_messages)
def test_encoding_is_injective(a: Message, b: Message) -> None:
    assert (a.encode() == b.encode()) == (a == b)
    assert (a.id == b.id) == (a == b)


def test_minimal_message_encoding() -> None:
    assert DEFAULTS.encode() == b'{"origin":"user","role":"user"}'


def test_encoding_is_utf8_not_ascii_escaped() -> None:
    data = Message(role="user", origin="user", text="héllo ✓").encode()
    assert "héllo ✓".encode() in data
    assert b"\\u" not in data


def test_tool_call_order_is_preserved_not_sorted() -> None:
    calls = (ToolCall("b", "n", "{}", 5), ToolCall("a", "n", "{}", 1))
    m = Message(role="assistant", origin="assistant", tool_calls=calls)
    assert Message.decode(m.encode()).tool_calls == calls
    assert [c["call_id"] for c in json.loads(m.encode())["tool_calls"]] == ["b", "a"]


def test_equal_messages_have_equal_bytes_whatever_the_construction_order() -> None:
    a = Message(role="tool", origin="tool", text="x", is_error=True, tool_call_id="c", completion_seq=2)
    b = Message(completion_seq=2, tool_call_id="c", is_error=True, text="x", origin="tool", role="tool")
    assert a.encode() == b.encode()
    assert a.id == b.id


@pytest.mark.parametrize(
    "change",
    [
        {"text": "y"},
        {"thinking": "t"},
        {"replay": ReplayState("k", "d")},
        {"tool_calls": (ToolCall("c", "n", "{}", 0),)},
        {"tool_call_id": "c"},
        {"tool_name": "n"},
        {"is_error": True},
        {"tool_round_id": "r"},
        {"completion_seq": 1},
        {"event_id": "e"},
        {"model_call_id": "m"},
        {"origin": "runtime"},
        {"role": "assistant"},
    ],
)
def test_every_field_is_part_of_the_identity(change: dict) -> None:
    changed = attrs.evolve(DEFAULTS, **change)
    assert changed.id != DEFAULTS.id
    assert Message.decode(changed.encode()) == changed


def test_empty_replay_state_is_kept() -> None:
    m = Message(role="assistant", origin="assistant", replay=ReplayState("", ""))
    assert Message.decode(m.encode()) == m


def test_canonical_json_sorts_nested_keys() -> None:
    assert canonical_json({"b": {"y": 1, "x": [2, {"d": 0, "c": 1}]}, "a": "é"}) == (
        '{"a":"é","b":{"x":[2,{"c":1,"d":0}],"y":1}}'.encode()
    )


def _round(n: int) -> list[Message]:
    calls = tuple(ToolCall(f"call-{n}-{k}", "Read", "{}", k) for k in range(2))
    head = Message(
        role="assistant",
        origin="assistant",
        tool_calls=calls,
        tool_round_id=f"round-{n}",
        model_call_id=f"mc-{n}",
    )
    results = [
        Message(
            role="tool",
            origin="tool",
            text=f"result {k}",
            tool_call_id=c.call_id,
            tool_name="Read",
            tool_round_id=f"round-{n}",
            completion_seq=k + 1,
        )
        for k, c in enumerate(calls)
    ]
    return [head, *results]


def test_messages_read_together_share_their_repeated_strings() -> None:
    # json.loads makes a new string object for every value; rows read together keep one
    # per distinct id (a round's id recurs in each result, a call id in its result).
    stored = _round(1) + _round(2)
    one: dict = {}
    got = tuple(Message.stored(m.id, m.encode(), one.setdefault) for m in stored)
    assert got == tuple(stored)
    head, first, second = got[:3]
    assert first.tool_round_id is head.tool_round_id and second.tool_round_id is head.tool_round_id
    assert first.tool_call_id is head.tool_calls[0].call_id
    assert second.tool_call_id is head.tool_calls[1].call_id
    assert got[3].tool_round_id is not head.tool_round_id  # another round, another id
    # Roles and tool names are interned, across decodes too.
    alone = Message.decode(stored[1].encode())
    assert alone.role is first.role and alone.tool_name is first.tool_name is head.tool_calls[0].name


def test_decoding_keeps_values_of_the_wrong_type_as_they_are() -> None:
    # Interning applies to strings only: a badly typed row still decodes (and is caught by
    # decodes_to_itself and the checks that read it), it does not raise TypeError here.
    data = b'{"origin":"user","role":7,"tool_round_id":["x"],"tool_name":{"a":1}}'
    m = Message.decode(data)
    assert (m.role, m.tool_round_id, m.tool_name) == (7, ["x"], {"a": 1})
    assert not m.decodes_to_itself()
    s = Message.stored(b"k" * 32, data)
    assert (s.role, s.tool_round_id, s.tool_name) == (7, ["x"], {"a": 1})


def test_a_stored_and_projected_message_holds_no_memo_dict() -> None:
    # Its id and history item have slots of their own; the dict is for the rarer memos.
    from byok.model.projection import project

    stored = [
        Message(role="user", origin="user", text="q"),
        *_round(1),
        Message(role="assistant", origin="assistant", text="a"),
    ]
    one: dict = {}
    got = tuple(Message.stored(m.id, m.encode(), one.setdefault) for m in stored)
    project(got)
    assert [m._memo is None for m in got] == [True] * (len(got) - 1) + [False]  # the last holds the prefix
    assert all(
        m._id is not None and m._item is not None for m in got if m.role != "assistant" or not m.tool_calls
    )


@given(st.lists(any_messages, max_size=8))
def test_a_stored_message_reads_back_as_the_message_it_encodes(messages: list[Message]) -> None:
    one: dict = {}
    stored = [Message.stored(m.id, m.encode(), one.setdefault) for m in messages]
    for m, s in zip(messages, stored, strict=True):
        assert s.stored_size == len(m.encode())
        assert s.encode() == m.encode() and s.id == m.id  # neither decodes the row
        assert s.stored_size is not None
        fields = attrs.filters.include(*[f for f in attrs.fields(Message) if f.init])
        assert s == m and attrs.asdict(s, filter=fields) == attrs.asdict(m, filter=fields)
        assert s.stored_size is None and s.encode() == m.encode()
        assert attrs.evolve(s, text="x") == attrs.evolve(m, text="x")


def test_a_stored_message_decodes_on_its_first_field_read_only() -> None:
    m = Message(role="tool", origin="tool", text="out", tool_call_id="c1", tool_round_id="r1")
    s = Message.stored(m.id, m.encode())
    assert s.stored_size is not None
    assert s.memo_get("anything") is None and s.id == m.id  # memos and the id: no decode
    assert s.tool_call_id == "c1" and s.stored_size is None
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        s.nonexistent  # noqa: B018
    with pytest.raises(AttributeError):
        Message(role="user", origin="user").nonexistent  # noqa: B018


def test_a_stored_row_that_is_not_a_message_fails_when_read_not_when_loaded() -> None:
    s = Message.stored(b"\x00" * 32, b'{"role": ')
    with pytest.raises(ValueError):
        s.text  # noqa: B018
    with pytest.raises(ValueError):  # still undecoded: fails the same way again
        s.role  # noqa: B018


def test_stored_messages_load_together_in_one_parse_or_each_on_its_own() -> None:
    one: dict = {}
    messages = _round(1) + _round(2)
    stored = [Message.stored(m.id, m.encode(), one.setdefault) for m in messages]
    Message.load_stored(stored)
    assert all(s.stored_size is None for s in stored) and stored == messages
    assert stored[1].tool_round_id is stored[0].tool_round_id  # strings shared as when read one by one
    bad = [Message.stored(m.id, m.encode()) for m in messages[:2]] + [Message.stored(b"k" * 32, b"[1,")]
    Message.load_stored(bad)  # the rows do not make one array: left to their own first reads
    assert all(s.stored_size is not None for s in bad)
    assert bad[0] == messages[0]
    with pytest.raises(ValueError):
        bad[2].role  # noqa: B018
