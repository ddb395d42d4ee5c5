"""Read numbering: the whole-text and shared-piece paths give what numbering each line would."""

from __future__ import annotations

from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from byok.cursor.tools import read_tool
from byok.cursor.tools.read_tool import READ, joined_lines, numbered, numbered_text, split_lines
from byok.pb.agent import v1 as agent

# Line breaks of every kind, near one another and at the ends; sometimes past a (patched) chunk.
line_texts = st.lists(st.sampled_from(["a", "bc", "\n", "\r", "\r\n", "\n\n", " é", "|"]), max_size=400).map(
    "".join
)


def reference_lines(text: str) -> list[str]:
    """Lines as split_lines first defined them: a pass over every line."""
    lines = text.split("\n") if text else []
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def reference_numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:>6}|{line}" for n, line in enumerate(lines, start=first))


@settings(max_examples=300)
@given(line_texts)
def test_split_and_joined_lines(text: str) -> None:
    assert split_lines(text) == reference_lines(text)
    if text:
        assert joined_lines(text) == "\n".join(reference_lines(text))


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from(["", "x", "a b"]), max_size=40) | st.integers(0, 400).map(lambda n: ["x"] * n),
    st.integers(-3, 120) | st.sampled_from([99_950, 999_990, 9_999_950, 123_456_789]),
)
def test_numbered_matches_the_per_line_format(lines: list[str], first: int) -> None:
    assert numbered(lines, first) == reference_numbered(lines, first)


@settings(max_examples=300)
@given(line_texts.filter(bool), st.integers(1, 10**7), st.integers(1, 40))
def test_numbered_text_in_chunks(text: str, first: int, chunk: int) -> None:
    text = joined_lines(text)
    with patch.object(read_tool, "_CHUNK", chunk):
        assert numbered_text(text, first) == (numbered(text.split("\n"), first), len(text.split("\n")))


@settings(max_examples=400)
@given(
    line_texts,
    st.none() | st.integers(-150, 150),
    st.none() | st.integers(1, 150),
    st.booleans(),
    st.integers(0, 200),
    st.integers(1, 60),
)
def test_read_success_shows_what_numbering_each_line_would(
    output: str, offset: int | None, limit: int | None, range_applied: bool, total_lines: int, chunk: int
) -> None:
    args = READ.parse({"path": "/a", "offset": offset, "limit": limit})
    success = agent.ReadSuccess(
        content=output, path="/a", total_lines=total_lines, range_applied=range_applied
    )
    with patch.object(read_tool, "_CHUNK", chunk):
        outcome = read_tool._read_success(args, success)
    # The reference: _read_success before it numbered whole texts.
    lines = reference_lines(output)
    total = max(total_lines, len(lines))
    start = 0 if not offset else offset - 1 if offset > 0 else max(total + offset, 0)
    end = len(lines) if limit is None else min(start + limit, len(lines))
    shown = lines if range_applied else lines[start:end]
    card = outcome.ui.read_tool_call.result.success
    assert card.content == "\n".join(shown)
    assert card.total_lines == total
    if shown:
        body, _, notes = outcome.content.partition("\n\n[")  # no numbered line starts with "["
        assert body == reference_numbered(shown, start + 1)
        assert not notes or notes.endswith("]")
        windowed = start > 0 or start + len(shown) < total
        expected_range = agent.ReadRange(start_line=start + 1, end_line=start + len(shown))
        assert card.read_range == (expected_range if windowed else None)
    else:
        assert outcome.content.startswith(("File is empty.", "No lines to show"))
