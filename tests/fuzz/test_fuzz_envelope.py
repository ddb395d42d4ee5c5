"""Fuzzing Connect envelopes (``FrameDecoder``, ``decode_unary_body``): frames or ProtocolError,
the same answer however the bytes are chunked; valid streams round-trip.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from byok.http.connect_envelope import (
    FLAG_COMPRESSED,
    FLAG_END_STREAM,
    FrameDecoder,
    ProtocolError,
    decode_unary_body,
    encode_frame,
)
from tests.fuzz.support import cut_offsets, fuzz, split


def _decode_all(decoder: FrameDecoder, pieces: list[bytes]) -> list[tuple[int, bytes]]:
    frames = []
    for piece in pieces:
        frames += [(f.flags, f.payload) for f in decoder.feed(piece)]
    decoder.end()
    return frames


def _outcome(fn: Callable[[], Any], error: type[BaseException]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except error as e:
        return ("error", type(e).__name__)


@fuzz(400)
@given(st.binary(max_size=300), cut_offsets)
def test_frame_decoder_on_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    """Frames or ProtocolError, and the same answer however the bytes are chunked."""
    whole = _outcome(lambda: _decode_all(FrameDecoder(200), [data]), ProtocolError)
    chunked = _outcome(lambda: _decode_all(FrameDecoder(200), split(data, cuts)), ProtocolError)
    if whole[0] == "ok":
        assert chunked == whole
    else:
        # Chunking may only change *which* violation is seen first (e.g. truncation vs oversize).
        assert chunked[0] == "error"


_frames = st.lists(
    st.tuples(st.binary(max_size=40), st.booleans()),
    max_size=4,
)


@fuzz(200)
@given(_frames, st.booleans(), cut_offsets)
def test_frame_decoder_round_trips_valid_streams(
    frames: list[tuple[bytes, bool]], end: bool, cuts: list[int]
) -> None:
    wire = b"".join(
        encode_frame(gzip.compress(p), FLAG_COMPRESSED) if z else encode_frame(p) for p, z in frames
    )
    if end:
        wire += encode_frame(b"{}", FLAG_END_STREAM)
    got = _decode_all(FrameDecoder(), split(wire, cuts))
    want = [(0, p) for p, _ in frames] + ([(FLAG_END_STREAM, b"{}")] if end else [])
    assert got == want


@fuzz(400)
@given(
    st.binary(max_size=200) | st.builds(lambda p: encode_frame(p), st.binary(max_size=60)),
    st.sampled_from(
        ["application/proto", "application/connect+proto", "", "text/plain", "APPLICATION/CONNECT+PROTO; x=1"]
    ),
    st.sampled_from([None, "identity", "gzip", " GZip ", "br", ""]),
    st.booleans(),
)
def test_decode_unary_body_on_arbitrary_bodies(
    body: bytes, content_type: str, encoding: str | None, gzipped: bool
) -> None:
    if gzipped:
        body = gzip.compress(body)
    try:
        out = decode_unary_body(body, content_type, encoding, max_bytes=150)
    except ProtocolError as e:
        assert e.code in ("invalid_argument", "resource_exhausted")
        return
    assert isinstance(out, bytes) and len(out) <= 150
