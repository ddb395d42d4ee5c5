from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor.tools.text_edit import (
    EditError,
    NewlineNormalizer,
    count_occurrences,
    normalize_newlines,
    replace_unique,
    unified_diff,
)

newline_text = st.text(alphabet=st.sampled_from(["a", "b", "\r", "\n", " ", "é"]), max_size=60)


def test_normalize_newlines() -> None:
    assert normalize_newlines("a\r\nb\rc\nd\r\n\r\n") == "a\nb\nc\nd\n\n"
    assert normalize_newlines("\r\r\n") == "\n\n"
    assert normalize_newlines("") == ""


def test_normalizer_holds_trailing_cr() -> None:
    n = NewlineNormalizer()
    assert n.feed("a\r") == "a"
    assert n.feed("\nb") == "\nb"
    assert n.feed("\r") == ""
    assert n.feed("") == ""
    assert n.feed("c") == "\nc"
    assert n.feed("\r") == ""
    assert n.flush() == "\n"
    assert n.flush() == ""


@given(newline_text, st.lists(st.integers(min_value=0, max_value=60), max_size=8))
def test_normalizer_any_split_matches_whole(text: str, cuts: list[int]) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    n = NewlineNormalizer()
    assert "".join(n.feed(p) for p in pieces) + n.flush() == normalize_newlines(text)


def test_replace_unique_success() -> None:
    assert replace_unique("one two three", "two", "2") == "one 2 three"


def test_replace_unique_crlf_file_is_matched_and_returned_lf() -> None:
    text = "line 1\r\nline 2\r\nline 3\r\n"
    assert replace_unique(text, "line 1\nline 2", "joined") == "joined\nline 3\n"
    # An old_string written with CRLF matches too.
    assert replace_unique("a\nb\n", "a\r\nb", "x") == "x\n"


def test_replace_unique_errors() -> None:
    with pytest.raises(EditError, match="must not be empty"):
        replace_unique("abc", "", "x")
    with pytest.raises(EditError, match="identical"):
        replace_unique("abc", "b", "b")
    with pytest.raises(EditError, match=r"old_string not found in src/x\.py"):
        replace_unique("abc", "zz", "y", path="src/x.py")
    with pytest.raises(EditError, match=r"occurs 3 times in f; .*unique or set replace_all"):
        replace_unique("x x x", "x", "y", path="f")


def test_replace_all() -> None:
    assert replace_unique("x x x", "x", "y", replace_all=True) == "y y y"
    with pytest.raises(EditError, match="not found"):
        replace_unique("abc", "q", "y", replace_all=True)


def test_overlapping_matches_are_ambiguous() -> None:
    assert count_occurrences("aaa", "aa") == 2
    with pytest.raises(EditError, match="occurs 2 times"):
        replace_unique("aaa", "aa", "b")


def test_unified_diff_edit() -> None:
    diff, added, removed = unified_diff("a.txt", "one\ntwo\nthree\n", "one\n2\nthree\nfour\n")
    assert (added, removed) == (2, 1)
    assert diff.startswith("--- a.txt\n+++ a.txt\n@@")
    assert "-two\n" in diff and "+2\n" in diff and "+four\n" in diff


def test_unified_diff_new_file_all_added() -> None:
    diff, added, removed = unified_diff("n.txt", None, "a\nb\n")
    assert (added, removed) == (2, 0)
    assert diff.startswith("--- /dev/null\n+++ n.txt\n")


def test_unified_diff_counts_lines_that_look_like_headers() -> None:
    _, added, removed = unified_diff("f", "--x\n++y\n", "++z\n")
    assert (added, removed) == (1, 2)


def test_unified_diff_missing_final_newline() -> None:
    diff, added, removed = unified_diff("f", "a\nb", "a\nc")
    assert (added, removed) == (1, 1)
    assert "-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n" in diff


def test_unified_diff_no_change() -> None:
    assert unified_diff("f", "same\n", "same\n") == ("", 0, 0)
