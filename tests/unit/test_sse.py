from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from byok.providers.sse import SSEDecoder, SSEEvent


def decode(*chunks: bytes) -> tuple[list[SSEEvent], SSEDecoder]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for c in chunks:
        out += d.feed(c)
    out += d.end()
    return out, d


def test_data_lines_event_names_and_comments() -> None:
    stream = (
        b": keep-alive\n\n"
        b"data: one\n\n"
        b'event: error\ndata: {"a":\ndata:  1}\n\n'
        b"data:nospace\n: inline comment\nid: 7\nretry: 10\n\n"
    )
    events, d = decode(stream)
    assert events == [
        SSEEvent("message", "one"),
        SSEEvent("error", '{"a":\n 1}'),  # only one leading space is stripped
        SSEEvent("message", "nospace"),
    ]
    assert not d.has_partial


def test_empty_data_dispatches_but_no_data_does_not() -> None:
    events, _ = decode(b"data:\n\nevent: x\n\ndata\n\n")
    # "data:" and the bare field name "data" both append an empty line; "event" alone does not.
    assert events == [SSEEvent("message", ""), SSEEvent("message", "")]


def test_event_name_resets_after_dispatch() -> None:
    events, _ = decode(b"event: ping\ndata: 1\n\ndata: 2\n\n")
    assert events == [SSEEvent("ping", "1"), SSEEvent("message", "2")]


def test_line_endings_crlf_cr_and_mixed() -> None:
    want = [SSEEvent("message", "a\nb"), SSEEvent("e", "c")]
    for nl in (b"\n", b"\r\n", b"\r"):
        assert (
            decode(b"data: a" + nl + b"data: b" + nl + nl + b"event: e" + nl + b"data: c" + nl + nl)[0]
            == want
        )
    assert decode(b"data: a\r\ndata: b\r\revent: e\ndata: c\r\n\n")[0] == want


def test_trailing_cr_held_across_feeds() -> None:
    # "\r" then "\n" in the next chunk is one line break, not two (which would dispatch early).
    events, _ = decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n")
    assert events == [SSEEvent("message", "a\nb")]
    # A held "\r" followed by other bytes is a line break of its own.
    assert decode(b"data: a\r", b"\r")[0] == [SSEEvent("message", "a")]


def test_cr_at_eof_terminates_the_line() -> None:
    events, d = decode(b"data: a\r\r")
    assert events == [SSEEvent("message", "a")]
    assert not d.has_partial


def test_unterminated_event_is_discarded_and_reported() -> None:
    events, d = decode(b"data: a\n\ndata: b\n")
    assert events == [SSEEvent("message", "a")]
    assert d.has_partial
    _, d = decode(b"data: a\n\ndata: par")
    assert d.has_partial
    _, d = decode(b"data: a\n\n: just a comment\n")
    assert not d.has_partial


def test_utf8_split_across_feeds_and_bom() -> None:
    raw = "\ufeffdata: héllo ✓ 😀\n\n".encode()
    assert decode(*(raw[i : i + 1] for i in range(len(raw))))[0] == [SSEEvent("message", "héllo ✓ 😀")]


def test_long_line_in_small_chunks() -> None:
    payload = b"x" * 200_000
    raw = b"data: " + payload + b"\n\n"
    events, _ = decode(*(raw[i : i + 7] for i in range(0, len(raw), 7)))
    assert events == [SSEEvent("message", payload.decode())]


def test_byte_by_byte_equals_whole() -> None:
    raw = b"event: a\r\ndata: 1\r\n\r\n: c\rdata: 2\rdata: 3\r\rdata: \xc3\xa9\n\n"
    whole, _ = decode(raw)
    assert len(whole) == 3
    assert decode(*(raw[i : i + 1] for i in range(len(raw))))[0] == whole


_line = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
_field = st.one_of(
    _line.map(lambda s: "data: " + s),
    _line.map(lambda s: "data:" + s),
    _line.map(lambda s: "event: " + s),
    _line.map(lambda s: ": " + s),
    st.just(""),
)


@given(
    lines=st.lists(_field, max_size=30),
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_arbitrary_chunking_gives_same_events(lines: list[str], newline: str, cuts: list[int]) -> None:
    raw = (newline.join(lines) + newline + newline).encode()
    whole, d1 = decode(raw)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    split, d2 = decode(*pieces)
    assert split == whole
    assert d1.has_partial == d2.has_partial
