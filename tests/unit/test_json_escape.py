"""json_string is json.dumps(text, ensure_ascii=False).encode() for every text, on either path;
Message.encode() splices it in and stays canonical_json of the fields."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byok.model import messages
from byok.model.messages import (
    _HOLE,
    _REPLACE_MIN,
    SPLICE_MIN,
    Message,
    ReplayState,
    ToolCall,
    canonical_json,
    json_string,
)

# Everything JSON treats specially, its neighbours, non-ASCII, and lone surrogates.
SURROGATES = ["\ud800", "\udfff"]
SPECIAL = [chr(c) for c in range(0x21)] + ['"', "\\", "/", "\x7f", "\x80", "é", "\u2028", "✓", "😀"]
pieces = st.lists(st.sampled_from([*SPECIAL, *SURROGATES, "a", "xyz"]), max_size=12).map("".join)
any_chars = st.text(alphabet=st.characters(exclude_categories=()), max_size=40)
# Past the threshold by repeating a drawn piece: as dense in escapes as the piece is.
repeated = st.builds(lambda s: s * (_REPLACE_MIN // max(len(s), 1) + 1), pieces | any_chars)


@st.composite
def sparse(draw: st.DrawFn, insert: st.SearchStrategy[str], size: int = _REPLACE_MIN) -> str:
    """A large plain text with a few drawn pieces put anywhere in it: the replace passes' case."""
    base = draw(st.sampled_from(["x", "line of text\n", "héllo wörld "]))
    text = list(base * (size // len(base) + 1))
    for piece in draw(st.lists(insert, max_size=6)):
        text.insert(draw(st.integers(0, len(text))), piece)
    return "".join(text)


any_texts = any_chars | pieces | repeated | sparse(pieces | any_chars)


def reference(text: str) -> bytes | type[BaseException]:
    try:
        return json.dumps(text, ensure_ascii=False).encode()
    except Exception as e:
        return type(e)


def ours(text: str) -> bytes | type[BaseException]:
    try:
        return json_string(text)
    except Exception as e:
        return type(e)


@settings(max_examples=500)
@given(any_texts)
def test_json_string_is_json_dumps(text: str) -> None:
    assert ours(text) == reference(text)


@pytest.mark.parametrize("char", SPECIAL + SURROGATES)
def test_each_special_character_in_a_large_text(char: str) -> None:
    for text in (("a" * 5000) + char + "b", char * 5000, (char + "ab\\n\n") * 1000):
        assert ours(text) == reference(text), repr(char)


def test_a_lone_surrogate_raises_as_the_reference_does() -> None:
    text = "a" * _REPLACE_MIN + "\udc80"
    with pytest.raises(UnicodeEncodeError):
        json.dumps(text, ensure_ascii=False).encode()
    with pytest.raises(UnicodeEncodeError):
        json_string(text)


def test_a_sparse_large_text_takes_the_replace_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    text = ('line "1"\t\\ é\r\n' + "x" * 200 + "\x00\x1f\x08\x0c") * 100
    expected = json.dumps(text, ensure_ascii=False).encode()
    monkeypatch.setattr(messages, "encode_basestring", None)  # any call to json's escaper fails
    assert json_string(text) == expected


def test_a_dense_large_text_is_left_to_the_json_escaper(monkeypatch: pytest.MonkeyPatch) -> None:
    text = '{"a":"b"}\n' * 1000
    calls: list[str] = []
    escape = messages.encode_basestring
    monkeypatch.setattr(messages, "encode_basestring", lambda t: calls.append(t) or escape(t))
    assert json_string(text) == json.dumps(text, ensure_ascii=False).encode()
    assert calls == [text]


# --- Message.encode() with the text spliced in --------------------------------------------------

fields = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8) | st.just(_HOLE)
no_surrogates = st.lists(st.sampled_from([*SPECIAL, "a", "xyz"]), max_size=8).map("".join)
large = st.builds(
    lambda s, hole: s * (SPLICE_MIN // max(len(s), 1) + 1) + (_HOLE if hole else ""),
    no_surrogates,
    st.booleans(),
)
messages_ = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    origin=st.sampled_from(["user", "runtime", "assistant", "tool"]),
    text=fields | large | sparse(no_surrogates | fields, SPLICE_MIN),
    thinking=fields,
    replay=st.none() | st.builds(ReplayState, provider_kind=fields, data=fields),
    tool_calls=st.lists(
        st.builds(ToolCall, call_id=fields, name=fields, arguments=fields, index=st.integers(0, 9)),
        max_size=2,
    ).map(tuple),
    tool_call_id=fields,
    tool_name=fields,
    is_error=st.booleans(),
    tool_round_id=fields,
    completion_seq=st.integers(0, 10**6),
    event_id=fields,
    model_call_id=fields,
)


@settings(max_examples=300)
@given(messages_)
def test_encode_is_canonical_json_and_text_json_is_json_string(m: Message) -> None:
    assert m.encode() == canonical_json(m.to_json_obj())
    assert bytes(m.text_json()) == json_string(m.text) == json.dumps(m.text, ensure_ascii=False).encode()
    fresh = attrs.evolve(m)  # no memos: text_json() before encode()
    assert bytes(fresh.text_json()) == json_string(m.text)
    assert fresh.id == m.id


def test_a_large_text_is_spliced_where_it_is_escaped() -> None:
    text = ("x" * 1000 + "".join(SPECIAL)) * 40  # sparse enough for the replace passes
    m = Message(role="tool", origin="tool", text=text, tool_call_id="c", tool_name="Read")
    data = m.encode()
    start, end = m.memo_get("text_span")
    assert data[start:end] == json_string(text)
    assert data == canonical_json(m.to_json_obj())
