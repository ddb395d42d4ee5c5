"""Fuzzing the edit engine (``text_edit``, the Write/StrReplace executions) and ``json_stream``
(a JSON string field streamed however chunked, the edit content stream).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from byok.cursor.tools.base import Finish, Invocation, SendExec, ToolArgError
from byok.cursor.tools.edit_tools import STR_REPLACE, WRITE
from byok.cursor.tools.json_stream import JsonStringField
from byok.cursor.tools.text_edit import (
    EditError,
    NewlineNormalizer,
    count_occurrences,
    normalize_newlines,
    replace_unique,
)
from byok.pb.agent import v1 as agent
from tests.fuzz.support import any_json, cut_offsets, fuzz, split

_newline_texts = st.lists(st.sampled_from(["a", "b", "\r", "\n", "\r\n", " ", "é", "\x00"]), max_size=20).map(
    "".join
)


# --- edit engine --------------------------------------------------------------------------------------


@fuzz(400)
@given(_newline_texts, cut_offsets)
def test_newline_normaliser_chunked_equals_whole(text: str, cuts: list[int]) -> None:
    whole = normalize_newlines(text)
    assert "\r" not in whole
    assert normalize_newlines(whole) == whole
    assert normalize_newlines(whole.replace("\n", "\r\n")) == whole  # LF -> CRLF -> LF round trip
    n = NewlineNormalizer()
    assert "".join(n.feed(p) for p in split(text, cuts)) + n.flush() == whole


@fuzz(400)
@given(_newline_texts, _newline_texts, _newline_texts, st.booleans())
def test_replace_unique_matches_a_reference(text: str, old: str, new: str, replace_all: bool) -> None:
    t, o, n = normalize_newlines(text), normalize_newlines(old), normalize_newlines(new)
    try:
        out = replace_unique(text, old, new, replace_all)
    except EditError as e:
        assert str(e)
        assert not o or o == n or o not in t or (not replace_all and count_occurrences(t, o) > 1)
        return
    assert o and o != n and o in t
    assert out == (t.replace(o, n) if replace_all else t.replace(o, n, 1))
    assert "\r" not in out
    # CRLF and LF spellings of the same file and strings give the same edit.
    crlf = replace_unique(t.replace("\n", "\r\n"), o.replace("\n", "\r\n"), n, replace_all)
    assert crlf == out


def _edit_round(tool: Any, args: dict[str, Any], file: str | None) -> tuple[str, str | None]:
    """Drive Write/StrReplace against a file: ("error", msg) or ("written", text)."""
    try:
        parsed = tool.parse(args)
    except ToolArgError as e:
        return ("error", str(e))
    execution = tool.execute(Invocation("call-1", tool.name, "mc-1", parsed))
    (read,) = execution.start()
    assert isinstance(read, SendExec) and read.message.read_args is not None
    if file is None:
        result = agent.ReadResult(file_not_found=agent.ReadFileNotFound())
    else:
        result = agent.ReadResult(success=agent.ReadSuccess(content=file))
    (action,) = execution.on_result(agent.ExecClientMessage(read_result=result))
    if isinstance(action, Finish):
        assert action.outcome.is_error
        return ("error", action.outcome.content)
    assert isinstance(action, SendExec) and action.message.write_args is not None
    written = action.message.write_args.file_text
    (done,) = execution.on_result(
        agent.ExecClientMessage(write_result=agent.WriteResult(success=agent.WriteSuccess()))
    )
    assert isinstance(done, Finish) and not done.outcome.is_error
    ui = done.outcome.ui.edit_tool_call.result.success
    assert ui.after_full_file_content == written
    assert ui.before_full_file_content == (None if file is None else normalize_newlines(file))
    return ("written", written)


@fuzz(300)
@given(st.none() | _newline_texts, _newline_texts, _newline_texts, st.booleans())
def test_str_replace_engine_writes_what_replace_unique_computes(
    file: str | None, old: str, new: str, replace_all: bool
) -> None:
    args = {"path": "f.txt", "old_string": old, "new_string": new, "replace_all": replace_all}
    kind, value = _edit_round(STR_REPLACE, args, file)
    if file is None:
        assert kind == "error"
        return
    try:
        want = replace_unique(file, old, new, replace_all)
    except EditError:
        assert kind == "error"
        return
    assert (kind, value) == ("written", want)


@fuzz(200)
@given(st.none() | _newline_texts, _newline_texts)
def test_write_engine_writes_lf_normalised_contents(file: str | None, contents: str) -> None:
    assert _edit_round(WRITE, {"path": "f.txt", "contents": contents}, file) == (
        "written",
        normalize_newlines(contents),
    )


# --- json_stream ----------------------------------------------------------------------------------------


@fuzz(400)
@given(
    st.dictionaries(st.sampled_from(["path", "new_string", "x", "new"]), any_json, max_size=3),
    st.text(max_size=20),
    st.booleans(),
    cut_offsets,
)
def test_json_string_field_streams_the_value_however_chunked(
    other: dict[str, Any], value: str, ascii_only: bool, cuts: list[int]
) -> None:
    obj = {k: v for k, v in other.items() if k != "new_string"}
    keys = list(obj)
    position = len(keys) // 2
    items = [
        *[(k, obj[k]) for k in keys[:position]],
        ("new_string", value),
        *[(k, obj[k]) for k in keys[position:]],
    ]
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=ascii_only)}" for k, v in items) + "}"
    field = JsonStringField("new_string")
    out = "".join(field.feed(p) for p in split(text, cuts))
    assert field.done
    assert out == json.loads(text)["new_string"]


_json_noise = st.lists(
    st.sampled_from([*'{}[]":,\\u0123abdf nrt', "\\ud83d", "\\ude00", "\\ud83d\\ude00", '\\"']), max_size=30
).map("".join)
# Openings that put the scanner inside the value of "a" (the "a" in the array is not the key).
_VALUE_OPENINGS = ['{"a":"', ' {"b":[1,"a"],"a": "']


def _closing_quote(text: str) -> int | None:
    """Index of the first unescaped quote in ``text``: where a JSON string value ends."""
    i = 0
    while i < len(text):
        if text[i] == '"':
            return i
        i += 2 if text[i] == "\\" else 1
    return None


def test_json_string_field_never_raises_on_arbitrary_text() -> None:
    """Any text: no exception, and chunking never changes a value that ended. Most texts open
    the object and the value first, so the arbitrary characters (escapes, lone surrogates,
    quotes) stream through the value: it ends exactly at its closing quote and equals what
    ``json.loads`` reads there. The tally makes sure values really end."""
    tally: Counter[str] = Counter()

    @fuzz(400)
    # Cuts inside an escape, between the two halves of a surrogate pair, inside the low half.
    @example(_VALUE_OPENINGS[0], 'x\\ud83d\\ude00\\n\\"y"', [9, 13, 15])
    @example(_VALUE_OPENINGS[1], '\\u01"', [21])  # a malformed escape, then the closing quote
    @given(
        st.sampled_from(["", *_VALUE_OPENINGS, *_VALUE_OPENINGS]),
        _json_noise | _json_noise.map(lambda t: t + '"'),  # often a closing quote at the end
        st.lists(st.integers(0, 90), max_size=8),  # cuts that land inside these short texts
    )
    def prop(opening: str, noise: str, cuts: list[int]) -> None:
        text = opening + noise
        field = JsonStringField("a")
        whole = field.feed(text)
        chunked_field = JsonStringField("a")
        chunked = "".join(chunked_field.feed(p) for p in split(text, cuts))
        assert isinstance(whole, str)
        assert chunked_field.done == field.done
        if field.done:
            # Chunking may only delay a held high surrogate, never change the decoded characters.
            assert chunked == whole
        if not opening:
            return
        end = _closing_quote(noise)
        assert field.done == (end is not None)
        if end is not None:
            try:
                want = json.loads('"' + noise[: end + 1])
            except ValueError:
                tally["ended, lenient"] += 1
                return  # an escape json.loads refuses: the scanner passes it through leniently
            assert whole == want
            tally["ended, checked"] += 1

    prop()
    assert tally["ended, checked"] >= 40, tally  # measured: ~150 of 400


@fuzz(300)
@given(st.text(max_size=30), cut_offsets)
def test_edit_content_stream_equals_the_normalised_argument(value: str, cuts: list[int]) -> None:
    value = value.replace("\r\n", "\r")  # plenty of CRs, some at chunk edges
    assert STR_REPLACE.args_stream is not None
    stream = STR_REPLACE.args_stream()
    text = json.dumps({"path": "a", "old_string": "x", "new_string": value})
    deltas = [d for p in split(text, cuts) for d in stream.feed(p)]
    got = "".join(d.edit_tool_call_delta.stream_content_delta for d in deltas)
    assert got == normalize_newlines(value)
