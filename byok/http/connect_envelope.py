"""Connect protocol framing, sans-IO: bytes in, values out.

A Connect stream is a sequence of envelopes: ``flags:u8``, ``length:u32 big-endian``, then
``length`` payload bytes. Flag ``0x01`` marks a gzip-compressed payload and ``0x02`` the
end-stream envelope, whose payload is JSON (``{}`` on success, ``{"error": ...}`` on failure).
Streaming errors always travel in that end-stream envelope on HTTP 200; unary errors use an
HTTP status plus a JSON body instead (see ``http_status_for`` / ``unary_error_body``).

Nothing here touches sockets or clocks, so every function is usable from any transport and
testable byte by byte.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Final, Literal, get_args

import attrs

from byok.config import DEFAULT_MAX_BODY_BYTES
from byok.pb.aiserver import v1 as aiserver

FLAG_COMPRESSED: Final = 0x01
FLAG_END_STREAM: Final = 0x02
_KNOWN_FLAGS: Final = FLAG_COMPRESSED | FLAG_END_STREAM

HEADER_SIZE: Final = 5
# R caps inbound messages at 64 MiB; matching it keeps byok as permissive as the reference
# while bounding what one peer can make us buffer.
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024

_HEADER: Final = struct.Struct(">BI")

ConnectCode = Literal[
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
]
CONNECT_CODES: Final[frozenset[str]] = frozenset(get_args(ConnectCode))

# Connect's code -> HTTP status table for unary errors (connectrpc.com/docs/protocol).
_HTTP_STATUS: Final[dict[str, int]] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

ERROR_DETAILS_TYPE: Final = "aiserver.v1.ErrorDetails"


def _check_code(_instance: object, _attribute: object, value: str) -> None:
    if value not in CONNECT_CODES:
        raise ValueError(f"not a Connect error code: {value!r}")


@attrs.frozen(auto_exc=True)
class ConnectError(Exception):
    """A Connect error as the peer will see it.

    ``details`` is an encoded ``aiserver.v1.ErrorDetails`` (Cursor renders it: title, retry
    button, ...); ``None`` when the error carries no detail.
    """

    code: ConnectCode = attrs.field(validator=_check_code)
    message: str = ""
    details: bytes | None = None

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class ProtocolError(Exception):
    """The peer broke the framing rules (bad envelope, bad gzip, message too large).

    ``code`` is the Connect code to answer with: ``invalid_argument`` for malformed input,
    ``resource_exhausted`` for size-limit violations.
    """

    def __init__(
        self, message: str, code: Literal["invalid_argument", "resource_exhausted"] = "invalid_argument"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code: Literal["invalid_argument", "resource_exhausted"] = code

    def to_connect_error(self) -> ConnectError:
        return ConnectError(self.code, self.message)


@attrs.frozen
class Frame:
    """One decoded envelope. ``payload`` is always uncompressed, so ``flags`` never has
    ``FLAG_COMPRESSED`` set: consumers must not be able to decompress twice."""

    flags: int
    payload: bytes

    @property
    def end_stream(self) -> bool:
        return bool(self.flags & FLAG_END_STREAM)


# --- encoding -------------------------------------------------------------------------


def encode_frame(payload: bytes, flags: int = 0) -> bytes:
    if not 0 <= flags <= 0xFF:
        raise ValueError(f"flags out of range: {flags}")
    if len(payload) > 0xFFFFFFFF:
        raise ValueError("payload does not fit a Connect envelope")
    return _HEADER.pack(flags, len(payload)) + payload


def _compact_json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _b64_no_pad(data: bytes) -> str:
    # Connect (and R, via STANDARD_NO_PAD) sends standard-alphabet base64 without '='.
    return base64.b64encode(data).rstrip(b"=").decode("ascii")


def _error_object(err: ConnectError) -> dict[str, object]:
    obj: dict[str, object] = {"code": err.code}
    if err.message:
        obj["message"] = err.message
    if err.details:
        obj["details"] = [{"type": ERROR_DETAILS_TYPE, "value": _b64_no_pad(err.details)}]
    return obj


def end_stream_ok() -> bytes:
    return encode_frame(b"{}", FLAG_END_STREAM)


def end_stream_error(err: ConnectError) -> bytes:
    return encode_frame(_compact_json({"error": _error_object(err)}), FLAG_END_STREAM)


def http_status_for(code: str) -> int:
    """HTTP status of a unary Connect error; unknown codes map to 500 like Connect's 'unknown'."""
    return _HTTP_STATUS.get(code, 500)


def unary_error_body(err: ConnectError) -> bytes:
    """JSON body of a unary Connect error (sent with ``Content-Type: application/json``)."""
    return _compact_json(_error_object(err))


def provider_error_details(detail: str, *, refused: bool = False) -> bytes:
    """Encoded ``ErrorDetails`` for a provider failure, shaped like R's so Cursor shows the
    same card: retryable errors get a retry button, refusals are shown immediately.

    R also sets ``allow_command_links_..._trusted_markdown``; byok leaves it unset because
    ``detail`` is provider text, i.e. not trusted markdown.
    """
    msg = aiserver.ErrorDetails(
        error=aiserver.ErrorDetailsError.PROVIDER_ERROR,
        is_expected=True,
        details=aiserver.CustomErrorDetails(
            title="Provider Refusal" if refused else "Provider Error",
            detail=detail,
            is_retryable=not refused,
            show_request_id=True,
            should_show_immediate_error=refused,
        ),
    )
    return bytes(msg)


# --- decoding -------------------------------------------------------------------------


class GzipStream:
    """Decompress (possibly multi-member) gzip fed in pieces, refusing to produce more than
    ``limit`` bytes in all: ``feed`` each piece, then ``end``."""

    def __init__(self, limit: int) -> None:
        self._d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self._open = False  # the current member has had input and not ended
        self._members = 0
        self._limit = limit
        self._out = 0

    def feed(self, data: bytes) -> bytes:
        parts: list[bytes] = []
        while data:
            self._open = True
            try:
                # max_length bounds memory even for a gzip bomb: it stops at limit+1 bytes.
                out = self._d.decompress(data, self._limit + 1 - self._out)
            except zlib.error as exc:
                raise ProtocolError(f"invalid gzip data: {exc}") from None
            self._out += len(out)
            if self._out > self._limit:
                raise ProtocolError(f"decompressed message exceeds {self._limit} bytes", "resource_exhausted")
            parts.append(out)
            if self._d.eof:  # the next member, if any
                data = self._d.unused_data
                self._d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                self._open = False
                self._members += 1
            else:
                data = self._d.unconsumed_tail
        return b"".join(parts)

    def end(self) -> None:
        """ProtocolError when the data stopped inside a member, or held none."""
        if self._open or not self._members:
            raise ProtocolError("truncated gzip data")


def _gunzip(data: bytes, limit: int) -> bytes:
    stream = GzipStream(limit)
    out = stream.feed(data)
    stream.end()
    return out


class FrameDecoder:
    """Incremental envelope parser: feed arbitrary slices, get whole frames back.

    The declared length is checked against ``max_message_bytes`` as soon as the 5-byte
    header is seen, so an oversized message is refused before any of it is buffered.
    Data after an end-stream frame is a protocol violation.
    """

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._max = max_message_bytes
        self._buf = bytearray()
        self._ended = False

    def feed(self, data: bytes) -> list[Frame]:
        if data and self._ended:
            raise ProtocolError("data after end-stream frame")
        self._buf += data
        frames: list[Frame] = []
        pos = 0  # parse by offset and trim once: avoids quadratic copies on many small frames
        try:
            while len(self._buf) - pos >= HEADER_SIZE and not self._ended:
                flags, length = _HEADER.unpack_from(self._buf, pos)
                if flags & ~_KNOWN_FLAGS:
                    raise ProtocolError(f"unknown envelope flags 0x{flags:02x}")
                if length > self._max:
                    raise ProtocolError(
                        f"message of {length} bytes exceeds limit of {self._max}", "resource_exhausted"
                    )
                end = pos + HEADER_SIZE + length
                if len(self._buf) < end:
                    break
                payload = bytes(self._buf[pos + HEADER_SIZE : end])
                pos = end
                if flags & FLAG_COMPRESSED:
                    payload = _gunzip(payload, self._max)
                    flags &= ~FLAG_COMPRESSED
                frame = Frame(flags, payload)
                self._ended = frame.end_stream
                frames.append(frame)
        finally:
            del self._buf[:pos]
        if self._ended and self._buf:
            raise ProtocolError("data after end-stream frame")
        return frames

    def end(self) -> None:
        """Call at end of body: a half-received envelope means the peer truncated the stream."""
        if self._buf:
            raise ProtocolError(f"stream ended inside a frame ({len(self._buf)} bytes pending)")


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _looks_enveloped(body: bytes) -> bool:
    # A raw proto can never start with 0x00 or 0x01 (that would be field number 0), so a
    # header whose flags are 0/1 and whose length covers the rest exactly is unambiguous.
    if len(body) < HEADER_SIZE:
        return False
    flags, length = _HEADER.unpack_from(body)
    return flags in (0, FLAG_COMPRESSED) and length == len(body) - HEADER_SIZE


def decode_unary_body(
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    *,
    max_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> bytes:
    """Proto bytes of a unary or server-stream request body.

    Cursor sends these either raw (``application/proto``) or as one Connect envelope
    (``application/connect+proto``); R accepts both and so do we. Any other content type is
    sniffed. HTTP ``Content-Encoding: gzip`` is undone first, then the envelope's own flag.
    ``max_bytes`` (the server's ``max_body_bytes``) also caps what gzip inflates to: a request
    may not unpack to more than it could have sent plain.
    """
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, max_bytes)
    elif encoding != "identity":
        raise ProtocolError(f"unsupported content-encoding {content_encoding!r}")
    if len(body) > max_bytes:
        raise ProtocolError(
            f"message of {len(body)} bytes exceeds limit of {max_bytes}", "resource_exhausted"
        )

    media = _media_type(content_type)
    if media == "application/proto":
        return body
    if media != "application/connect+proto" and not _looks_enveloped(body):
        return body

    decoder = FrameDecoder(max_bytes)
    frames = decoder.feed(body)
    decoder.end()
    if len(frames) != 1 or frames[0].end_stream:
        raise ProtocolError(f"expected exactly one message envelope, got {len(frames)} frame(s)")
    return frames[0].payload
