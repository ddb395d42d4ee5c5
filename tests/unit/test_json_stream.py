from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from byok.cursor.tools.json_stream import JsonStringField

KEY = "contents"

# Keys from a small alphabet so the target key also turns up inside nested objects.
keys = st.sampled_from([KEY, "path", "c", 'q"uote', "back\\slash", "ünï"]) | st.text(max_size=6)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
# Surrogates included: json.dumps writes lone ones as \udXXX escapes (or raw, without ensure_ascii).
target_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=40) | st.text(max_size=40)


def feed_all(source: str, cuts: list[int], key: str = KEY) -> tuple[str, JsonStringField]:
    points = sorted({min(c, len(source)) for c in cuts})
    pieces = [source[a:b] for a, b in zip([0, *points], [*points, len(source)], strict=True)]
    field = JsonStringField(key)
    return "".join(field.feed(p) for p in pieces), field


@settings(max_examples=400)
@given(
    others=st.dictionaries(keys.filter(lambda k: k != KEY), values, max_size=4),
    value=target_text,
    position=st.integers(min_value=0, max_value=4),
    ensure_ascii=st.booleans(),
    indent=st.none() | st.integers(min_value=0, max_value=2),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
)
def test_any_object_any_split(
    others: dict[str, Any], value: str, position: int, ensure_ascii: bool, indent: int | None, cuts: list[int]
) -> None:
    items = list(others.items())
    items.insert(min(position, len(items)), (KEY, value))
    source = json.dumps(dict(items), ensure_ascii=ensure_ascii, indent=indent)
    # The oracle is json.loads: it also pairs two lone surrogates that end up adjacent.
    expected = json.loads(source)[KEY]
    out, field = feed_all(source, cuts)
    assert out == expected
    assert field.done


@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=40))
def test_escapes_split_everywhere(cuts: list[int]) -> None:
    source = r'{"contents": "a\"b\\c\/d\n\t\r\b\f\u00e9\ud83d\ude00\u0041\ud800x\udc00"}'
    out, _ = feed_all(source, cuts)
    assert out == json.loads(source)[KEY]


def test_every_single_character_fragment() -> None:
    source = json.dumps({"path": "x", "contents": 'héllo\n😀 "q"', "n": [1, {"contents": "no"}]})
    field = JsonStringField(KEY)
    out = [field.feed(ch) for ch in source]
    assert "".join(out) == 'héllo\n😀 "q"'
    # Output is incremental: characters come out as they arrive, not at the end.
    assert sum(1 for o in out if o) > 5


def test_nested_key_is_ignored() -> None:
    field = JsonStringField(KEY)
    assert field.feed('{"meta": {"contents": "nested"}, "list": ["contents", "x"], ') == ""
    assert field.feed('"contents": "top"}') == "top"


def test_key_written_with_escapes() -> None:
    out, _ = feed_all('{"\\u0063ontents": "v"}', [3, 9])
    assert out == "v"


def test_value_that_is_not_a_string_yields_nothing() -> None:
    out, field = feed_all('{"contents": {"a": "b"}, "x": "y"}', [])
    assert out == ""
    assert not field.done


def test_only_first_occurrence_and_nothing_after_the_object() -> None:
    field = JsonStringField(KEY)
    assert field.feed('{"contents": "one", "contents": "two"}') == "one"
    assert field.feed('{"contents": "three"}') == ""


def test_not_an_object_yields_nothing() -> None:
    out, _ = feed_all('["contents", "x"]', [])
    assert out == ""


def test_done_only_after_closing_quote() -> None:
    field = JsonStringField(KEY)
    assert field.feed('{"contents": "ab') == "ab"
    assert not field.done
    assert field.feed('c"') == "c"
    assert field.done


def test_high_surrogate_waits_for_its_pair() -> None:
    field = JsonStringField(KEY)
    assert field.feed('{"contents": "\\ud83d') == ""
    assert field.feed("\\ude0") == ""
    assert field.feed('0"}') == "😀"
