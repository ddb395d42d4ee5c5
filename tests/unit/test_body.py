"""A body spliced from its pieces reads as the bytes it stands for: whole, sliced, in chunks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byok.model import body as body_module
from byok.model.body import SplicedBody, as_bytes, chunks, view

pieces = st.binary(max_size=12)


@settings(max_examples=500, deadline=None)
@given(
    lead=pieces.map(lambda b: b + b"["),
    items=st.lists(pieces, max_size=8),
    trail=pieces.map(lambda b: b"]" + b),
    cut=st.tuples(st.integers(-2, 120), st.integers(-2, 120)),
    chunk=st.integers(1, 40),
)
def test_every_view_of_a_spliced_body_is_that_of_its_bytes(
    lead: bytes, items: list[bytes], trail: bytes, cut: tuple[int, int], chunk: int
) -> None:
    whole = lead + b",".join(items) + trail
    spliced = SplicedBody(lead, tuple(items), trail)
    assert bytes(spliced) == as_bytes(spliced) == whole and len(spliced) == len(whole)
    start, stop = max(cut[0], 0), max(cut[1], 0)
    assert spliced.slice(start, stop) == whole[start:stop]
    assert bytes(view(spliced, start, stop)) == bytes(view(whole, start, stop)) == whole[start:stop]
    saved = body_module.CHUNK_BYTES
    body_module.CHUNK_BYTES = chunk
    try:
        got = list(chunks(spliced, start, stop))
    finally:
        body_module.CHUNK_BYTES = saved
    assert b"".join(got) == whole[start:stop]
    # Groups stay within the limit unless one piece alone is larger.
    assert all(len(c) <= max(chunk, max(map(len, [lead, trail, *items]))) for c in got)


@pytest.mark.parametrize("items", [(), (b"1",), (b'{"a":1}', b"2")])
def test_a_whole_body_is_handed_out_as_whole_pieces_not_views(items: tuple[bytes, ...]) -> None:
    spliced = SplicedBody(b'{"messages":[', items, b"]}")
    assert all(isinstance(c, bytes) for c in spliced.chunks())  # what httpx is given to send
    assert b"".join(spliced.chunks()) == bytes(spliced)
