from __future__ import annotations

import base64
import gzip
import json

import attrs
import pytest

from byok.http.connect_envelope import (
    DEFAULT_MAX_MESSAGE_BYTES,
    FLAG_COMPRESSED,
    FLAG_END_STREAM,
    ConnectError,
    Frame,
    FrameDecoder,
    ProtocolError,
    decode_unary_body,
    encode_frame,
    end_stream_error,
    end_stream_ok,
    http_status_for,
    provider_error_details,
    unary_error_body,
)
from byok.pb.aiserver import v1 as aiserver


def _b64decode_nopad(s: str) -> bytes:
    return base64.b64decode(s + "=" * (-len(s) % 4))


# --- encoding -------------------------------------------------------------------------


def test_encode_frame_header_layout() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert encode_frame(b"", 0x02) == b"\x02\x00\x00\x00\x00"
    assert encode_frame(b"x" * 0x010203)[:5] == b"\x00\x00\x01\x02\x03"


def test_encode_frame_rejects_bad_flags() -> None:
    with pytest.raises(ValueError):
        encode_frame(b"", 256)


def test_end_stream_ok_is_exact() -> None:
    assert end_stream_ok() == b"\x02\x00\x00\x00\x02{}"


def test_end_stream_error_exact_bytes_without_details() -> None:
    payload = b'{"error":{"code":"canceled","message":"run was cancelled"}}'
    assert end_stream_error(ConnectError("canceled", "run was cancelled")) == (
        b"\x02" + len(payload).to_bytes(4, "big") + payload
    )


def test_end_stream_error_omits_empty_message() -> None:
    assert end_stream_error(ConnectError("internal")) == encode_frame(
        b'{"error":{"code":"internal"}}', FLAG_END_STREAM
    )


def test_end_stream_error_with_details_exact_bytes() -> None:
    details = b"\x08\x39\x18\x01"  # 4 bytes -> base64 needs '==' padding, which must be absent
    frame = end_stream_error(ConnectError("unavailable", "boom", details))
    payload = (
        b'{"error":{"code":"unavailable","message":"boom",'
        b'"details":[{"type":"aiserver.v1.ErrorDetails","value":"CDkYAQ"}]}}'
    )
    assert frame == encode_frame(payload, FLAG_END_STREAM)


@pytest.mark.parametrize("n", range(1, 8))
def test_details_base64_never_padded(n: int) -> None:
    details = bytes(range(n))
    frame = end_stream_error(ConnectError("unavailable", "x", details))
    value = json.loads(frame[5:])["error"]["details"][0]["value"]
    assert "=" not in value
    assert _b64decode_nopad(value) == details


def test_non_ascii_message_is_utf8_json() -> None:
    frame = end_stream_error(ConnectError("internal", "échec"))
    assert json.loads(frame[5:].decode("utf-8"))["error"]["message"] == "échec"


def test_provider_error_details_decode_back() -> None:
    frame = end_stream_error(
        ConnectError("unavailable", "rate limited", provider_error_details("429 slow down"))
    )
    value = json.loads(frame[5:])["error"]["details"][0]["value"]
    msg = aiserver.ErrorDetails.parse(_b64decode_nopad(value))
    assert msg.error == aiserver.ErrorDetailsError.PROVIDER_ERROR
    assert msg.is_expected is True
    assert msg.details is not None
    assert msg.details.title == "Provider Error"
    assert msg.details.detail == "429 slow down"
    assert msg.details.is_retryable is True
    assert msg.details.show_request_id is True
    assert msg.details.should_show_immediate_error is False


def test_provider_refusal_details() -> None:
    msg = aiserver.ErrorDetails.parse(provider_error_details("nope", refused=True))
    assert msg.details is not None
    assert msg.details.title == "Provider Refusal"
    assert msg.details.is_retryable is False
    assert msg.details.should_show_immediate_error is True
    assert msg.details.show_request_id is True


def test_connect_error_is_frozen_exception() -> None:
    err = ConnectError("not_found", "run not found")
    assert str(err) == "not_found: run not found"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        err.code = "internal"  # type: ignore[misc]
    with pytest.raises(ConnectError) as info:
        raise err
    assert info.value.code == "not_found"


def test_connect_error_rejects_unknown_code() -> None:
    with pytest.raises(ValueError):
        ConnectError("bogus")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("invalid_argument", 400),
        ("not_found", 404),
        ("resource_exhausted", 429),
        ("unavailable", 503),
        ("internal", 500),
        ("canceled", 499),
        ("unimplemented", 501),
        ("deadline_exceeded", 504),
        ("failed_precondition", 400),
        ("aborted", 409),
        ("unauthenticated", 401),
        ("permission_denied", 403),
    ],
)
def test_http_status_for(code: str, status: int) -> None:
    assert http_status_for(code) == status


def test_unary_error_body() -> None:
    assert unary_error_body(ConnectError("not_found", "no such run")) == (
        b'{"code":"not_found","message":"no such run"}'
    )
    assert unary_error_body(ConnectError("internal")) == b'{"code":"internal"}'


# --- decoding -------------------------------------------------------------------------


def test_decoder_round_trip_several_frames_in_one_feed() -> None:
    data = encode_frame(b"one") + encode_frame(b"") + encode_frame(b"three") + end_stream_ok()
    frames = FrameDecoder().feed(data)
    assert frames == [Frame(0, b"one"), Frame(0, b""), Frame(0, b"three"), Frame(FLAG_END_STREAM, b"{}")]
    assert frames[-1].end_stream and not frames[0].end_stream


def test_decoder_byte_by_byte() -> None:
    payloads = [b"alpha", b"", b"x" * 300, b"\x00\x01\x02"]
    data = b"".join(encode_frame(p) for p in payloads)
    decoder = FrameDecoder()
    got: list[Frame] = []
    for i in range(len(data)):
        got += decoder.feed(data[i : i + 1])
    decoder.end()
    assert [f.payload for f in got] == payloads


def test_decoder_gzip_frame_is_decompressed_and_flag_cleared() -> None:
    data = encode_frame(gzip.compress(b"hello" * 100), FLAG_COMPRESSED)
    decoder = FrameDecoder()
    frames = decoder.feed(data[:7]) + decoder.feed(data[7:])
    assert frames == [Frame(0, b"hello" * 100)]


def test_decoder_compressed_end_stream() -> None:
    frames = FrameDecoder().feed(encode_frame(gzip.compress(b"{}"), FLAG_COMPRESSED | FLAG_END_STREAM))
    assert frames == [Frame(FLAG_END_STREAM, b"{}")]


def test_decoder_bad_gzip() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameDecoder().feed(encode_frame(b"not gzip", FLAG_COMPRESSED))
    assert info.value.code == "invalid_argument"


def test_decoder_truncated_gzip() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameDecoder().feed(encode_frame(gzip.compress(b"x" * 1000)[:-10], FLAG_COMPRESSED))
    assert info.value.code == "invalid_argument"


def test_decoder_oversize_rejected_from_header_alone() -> None:
    decoder = FrameDecoder(max_message_bytes=10)
    # Only the header arrives: the declared length is enough to refuse.
    with pytest.raises(ProtocolError) as info:
        decoder.feed(b"\x00\x00\x00\x00\x0b")
    assert info.value.code == "resource_exhausted"


def test_decoder_limit_is_inclusive() -> None:
    assert FrameDecoder(max_message_bytes=10).feed(encode_frame(b"x" * 10)) == [Frame(0, b"x" * 10)]


def test_default_limit_is_64_mib() -> None:
    assert DEFAULT_MAX_MESSAGE_BYTES == 64 * 1024 * 1024
    with pytest.raises(ProtocolError) as info:
        FrameDecoder().feed((64 * 1024 * 1024 + 1).to_bytes(5, "big"))
    assert info.value.code == "resource_exhausted"


def test_decoder_gzip_bomb_capped() -> None:
    bomb = encode_frame(gzip.compress(b"\x00" * 10_000), FLAG_COMPRESSED)
    with pytest.raises(ProtocolError) as info:
        FrameDecoder(max_message_bytes=1000).feed(bomb)
    assert info.value.code == "resource_exhausted"


def test_decoder_truncated_stream() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(b"hello")[:-1]) == []
    with pytest.raises(ProtocolError) as info:
        decoder.end()
    assert info.value.code == "invalid_argument"


def test_decoder_truncated_header() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x00\x00")
    with pytest.raises(ProtocolError):
        decoder.end()


def test_decoder_clean_end() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(b"a")) == [Frame(0, b"a")]  # exactly the one frame
    assert decoder.feed(b"") == []  # and nothing held back to come out later
    decoder.end()  # nothing pending: the stream ends cleanly (a truncated one raises)


def test_decoder_unknown_flags() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameDecoder().feed(encode_frame(b"x", 0x80))
    assert info.value.code == "invalid_argument"


def test_decoder_data_after_end_stream() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(end_stream_ok() + encode_frame(b"late"))


def test_protocol_error_to_connect_error() -> None:
    err = ProtocolError("too big", "resource_exhausted").to_connect_error()
    assert (err.code, err.message, err.details) == ("resource_exhausted", "too big", None)


# --- unary bodies ---------------------------------------------------------------------

PROTO = bytes(aiserver.BidiRequestId(request_id="abc-123"))


def test_unary_raw_proto() -> None:
    assert decode_unary_body(PROTO, "application/proto", None) == PROTO


def test_unary_enveloped_connect_proto() -> None:
    assert decode_unary_body(encode_frame(PROTO), "application/connect+proto", None) == PROTO


def test_unary_enveloped_with_gzip_flag() -> None:
    body = encode_frame(gzip.compress(PROTO), FLAG_COMPRESSED)
    assert decode_unary_body(body, "application/connect+proto; charset=utf-8", None) == PROTO


@pytest.mark.parametrize("content_type", ["", "application/octet-stream", "text/event-stream"])
def test_unary_sniffing(content_type: str) -> None:
    assert decode_unary_body(encode_frame(PROTO), content_type, None) == PROTO
    assert decode_unary_body(PROTO, content_type, None) == PROTO
    assert decode_unary_body(b"", content_type, None) == b""


def test_unary_application_proto_is_never_unwrapped() -> None:
    # Declared raw: taken as is even if it happens to look like an envelope.
    body = encode_frame(b"")
    assert decode_unary_body(body, "application/proto", None) == body


def test_unary_content_encoding_gzip() -> None:
    assert decode_unary_body(gzip.compress(PROTO), "application/proto", "gzip") == PROTO
    body = gzip.compress(encode_frame(PROTO))
    assert decode_unary_body(body, "application/connect+proto", "GZIP") == PROTO


def test_unary_content_encoding_identity_and_unknown() -> None:
    assert decode_unary_body(PROTO, "application/proto", "identity") == PROTO
    with pytest.raises(ProtocolError):
        decode_unary_body(PROTO, "application/proto", "br")


def test_unary_gzip_size_cap() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_unary_body(gzip.compress(b"\x00" * 5000), "application/proto", "gzip", max_bytes=1000)
    assert info.value.code == "resource_exhausted"


def test_unary_connect_proto_must_be_one_frame() -> None:
    with pytest.raises(ProtocolError):
        decode_unary_body(encode_frame(PROTO) + encode_frame(PROTO), "application/connect+proto", None)
    with pytest.raises(ProtocolError):
        decode_unary_body(encode_frame(PROTO)[:-1], "application/connect+proto", None)
    with pytest.raises(ProtocolError):
        decode_unary_body(end_stream_ok(), "application/connect+proto", None)
