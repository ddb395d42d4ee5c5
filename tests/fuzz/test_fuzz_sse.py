"""Fuzzing ``SSEDecoder``: chunking never changes the events; events round-trip with any line ending."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from byok.providers.sse import SSEDecoder, SSEEvent
from tests.fuzz.support import cut_offsets, fuzz, split


def _sse_all(pieces: list[bytes]) -> tuple[list[SSEEvent], bool]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for p in pieces:
        out += d.feed(p)
    out += d.end()
    return out, d.has_partial


@fuzz(500)
@given(
    st.binary(max_size=200)
    | st.lists(
        st.sampled_from(
            [
                b"data: x",
                b"data:",
                b"event: e",
                b":c",
                b"\r",
                b"\n",
                b"\r\n",
                b"id: 1",
                b"\xef\xbb\xbf",
                b"\xc3",
                b"\xa9",
            ]
        ),
        max_size=20,
    ).map(b"".join),
    cut_offsets,
)
def test_sse_decoder_chunking_does_not_change_events(data: bytes, cuts: list[int]) -> None:
    assert _sse_all(split(data, cuts)) == _sse_all([data])


_sse_events = st.lists(
    st.tuples(
        st.sampled_from(["", "message", "delta", "error"]),
        st.lists(
            st.text(
                alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=8
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    max_size=5,
)


@fuzz(300)
@given(_sse_events, st.sampled_from(["\n", "\r\n", "\r"]), cut_offsets)
def test_sse_decoder_round_trips_events(
    events: list[tuple[str, list[str]]], eol: str, cuts: list[int]
) -> None:
    wire = ""
    for name, lines in events:
        if name:
            wire += f"event: {name}{eol}"
        wire += "".join(f"data: {line}{eol}" for line in lines) + eol
    got, partial = _sse_all(split(wire.encode(), cuts))
    assert not partial
    want = [SSEEvent(name or "message", "\n".join(lines)) for name, lines in events]
    assert got == want
