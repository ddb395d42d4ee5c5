"""The routing fields of a BidiAppend too large to keep.

An append over ``max_body_bytes`` cannot be held, but its run must still hear of it: the exec
it answers would otherwise wait forever (its card spinning), and every later append of the run
would queue behind its seqno, the user's cancel included. So the body is read to its end
without being kept, and only what routes it is: the request id, the seqno, and the first bytes
of ``data``, which name the exec (``ExecClientMessage.id`` is its first field).

Sans-IO: ``AppendSkim.feed`` takes the body's pieces as they arrive; ``result`` reads the
fields. Handles what ``decode_unary_body`` does: HTTP gzip, raw proto or one Connect envelope
(itself gzip-compressed or not).
"""

from __future__ import annotations

import attrs

from byok.cursor import proto_decode
from byok.http.connect_envelope import FLAG_COMPRESSED, HEADER_SIZE, GzipStream, ProtocolError
from byok.pb.aiserver import v1 as aiserver

# Hex characters of ``data`` kept: the AgentClientMessage's tag and length, then the exec's
# id (and its exec_id string, which comes next) fit well inside.
KEEP_DATA_HEX = 512
# The request id message and any other small field are kept whole up to this.
_MAX_SMALL_FIELD = 4096
_DATA, _REQUEST_ID, _SEQNO, _DATA_BINARY = 1, 2, 3, 4
_ENVELOPED = {"application/proto": False, "application/connect+proto": True}


@attrs.frozen
class SkimmedAppend:
    request_id: str
    seqno: int
    data_head: str  # the first KEEP_DATA_HEX characters of ``data``
    data_size: int  # characters of ``data``
    has_binary: bool  # data_binary was set (an error on an agent request)


class _Fields:
    """The top-level fields of a protobuf message fed in pieces, keeping only the small ones
    and the start of ``data``."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._field = 0  # inside a length-delimited field: its number...
        self._left = 0  # ...and the bytes of it still to come
        self.kept: dict[int, bytearray] = {}
        self.sizes: dict[int, int] = {}
        self.varints: dict[int, int] = {}

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left:
                take = view[: self._left]
                self._keep(self._field, take)
                self._left -= len(take)
                view = view[len(take) :]
                continue
            self._buf += view[:16]  # a tag and a varint: at most 20 bytes, read in steps
            view = view[16:]
            while not self._left and self._header():
                pass
            if self._left and self._buf:  # the payload began inside what was buffered
                pending, self._buf = bytes(self._buf), bytearray()
                view = memoryview(pending + bytes(view))

    def _header(self) -> bool:
        """Consume one complete field header from the buffer (and a whole varint or fixed
        field); False when the buffer holds only part of one."""
        buf = bytes(self._buf)
        if not buf:
            return False
        try:
            tag, pos = proto_decode.varint(buf, 0, len(buf))
            field, wire = tag >> 3, tag & 7
            if field == 0:
                raise ProtocolError("field number 0")
            if wire == 0:
                value, pos = proto_decode.varint(buf, pos, len(buf))
                self.varints[field] = value
            elif wire == 2:
                size, pos = proto_decode.varint(buf, pos, len(buf))
                self._field, self._left = field, size
                self.sizes[field] = size
                self.kept[field] = bytearray()
            elif wire in (1, 5):
                size = 8 if wire == 1 else 4
                if len(buf) < pos + size:
                    return False
                pos += size
            else:
                raise ProtocolError(f"wire type {wire} in a BidiAppendRequest")
        except proto_decode.Truncated:
            if len(buf) > 20:
                raise ProtocolError("malformed field header") from None
            return False
        except ValueError as e:
            raise ProtocolError(str(e)) from None
        del self._buf[:pos]
        return True

    def _keep(self, field: int, piece: memoryview) -> None:
        kept = self.kept[field]
        room = (KEEP_DATA_HEX if field == _DATA else _MAX_SMALL_FIELD) - len(kept)
        if room > 0:
            kept += piece[:room]

    def end(self) -> None:
        if self._left or self._buf:
            raise ProtocolError("body ends inside a field")


class AppendSkim:
    """Feed an over-limit BidiAppend body piece by piece, then read its routing fields."""

    def __init__(self, content_type: str, content_encoding: str | None, *, inflate_limit: int) -> None:
        encoding = (content_encoding or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise ProtocolError(f"unsupported content-encoding {content_encoding!r}")
        self._http_gzip = GzipStream(inflate_limit) if encoding == "gzip" else None
        media = content_type.split(";", 1)[0].strip().lower()
        # None: decided by the first byte (a raw proto never starts with 0x00 or 0x01).
        self._enveloped: bool | None = {"application/proto": False, "application/connect+proto": True}.get(
            media
        )
        self._inflate_limit = inflate_limit
        self._header = bytearray()
        self._payload_left = -1  # bytes of the envelope's payload still to come
        self._payload_gzip: GzipStream | None = None
        self.fields = _Fields()

    def feed(self, chunk: bytes) -> None:
        if self._http_gzip is not None:
            chunk = self._http_gzip.feed(chunk)
        if not chunk:
            return
        if self._enveloped is None:
            self._enveloped = chunk[0] in (0, FLAG_COMPRESSED)
        if not self._enveloped:
            self.fields.feed(chunk)
            return
        if self._payload_left < 0:
            need = HEADER_SIZE - len(self._header)
            self._header += chunk[:need]
            chunk = chunk[need:]
            if len(self._header) < HEADER_SIZE:
                return
            flags = self._header[0]
            if flags not in (0, FLAG_COMPRESSED):
                raise ProtocolError(f"unexpected envelope flags {flags:#x} on a unary request")
            self._payload_left = int.from_bytes(self._header[1:], "big")
            if flags & FLAG_COMPRESSED:
                self._payload_gzip = GzipStream(self._inflate_limit)
        if len(chunk) > self._payload_left:
            raise ProtocolError("data after the request's one envelope")
        self._payload_left -= len(chunk)
        if self._payload_gzip is not None:
            chunk = self._payload_gzip.feed(chunk)
        self.fields.feed(chunk)

    def result(self) -> SkimmedAppend:
        """The fields, once the whole body was fed. ProtocolError when it ended early or is
        not a BidiAppendRequest with a request id."""
        if self._http_gzip is not None:
            self._http_gzip.end()
        if self._enveloped and self._payload_left != 0:
            raise ProtocolError("body ends inside its envelope")
        if self._payload_gzip is not None:
            self._payload_gzip.end()
        fields = self.fields
        fields.end()
        try:
            rid = proto_decode.parse(aiserver.BidiRequestId, bytes(fields.kept.get(_REQUEST_ID, b"")))
        except ValueError as e:
            raise ProtocolError(f"undecodable request_id: {e}") from None
        if not rid.request_id:
            raise ProtocolError("BidiAppend has no request_id")
        seqno = fields.varints.get(_SEQNO, 0)
        if seqno >= 1 << 63:  # int64 on the wire
            seqno -= 1 << 64
        try:
            head = bytes(fields.kept.get(_DATA, b"")).decode("ascii")
        except UnicodeDecodeError:
            head = ""
        return SkimmedAppend(
            request_id=rid.request_id,
            seqno=seqno,
            data_head=head,
            data_size=fields.sizes.get(_DATA, 0),
            has_binary=fields.sizes.get(_DATA_BINARY, 0) > 0,
        )


def exec_id_of(data_head: str) -> int | None:
    """The ``ExecClientMessage.id`` the hex head of an AgentClientMessage names, when the
    message is an exec_client_message and its id comes before the result; else None."""
    try:
        raw = bytes.fromhex(data_head[: len(data_head) & ~1])
    except ValueError:
        return None
    try:
        tag, pos = proto_decode.varint(raw, 0, len(raw))
        if tag != (2 << 3 | 2):  # exec_client_message, length-delimited
            return None
        _, pos = proto_decode.varint(raw, pos, len(raw))
        while pos < len(raw):
            tag, pos = proto_decode.varint(raw, pos, len(raw))
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                value, pos = proto_decode.varint(raw, pos, len(raw))
                if field == 1:
                    return value if value < 1 << 32 else None
            elif wire == 2:
                size, pos = proto_decode.varint(raw, pos, len(raw))
                pos += size
            else:
                return None
    except (proto_decode.Truncated, ValueError):
        return None
    return None


def is_whole_run_request(data_head: str, data_size: int) -> bool:
    """Whether ``data`` (its hex head and length) is one AgentClientMessage holding a run_request
    and nothing else: its first field is run_request and spans exactly the rest of the data."""
    if data_size % 2:
        return False
    try:
        raw = bytes.fromhex(data_head[: len(data_head) & ~1])
        tag, pos = proto_decode.varint(raw, 0, len(raw))
        if tag != (1 << 3 | 2):  # run_request, length-delimited
            return False
        size, pos = proto_decode.varint(raw, pos, len(raw))
    except (proto_decode.Truncated, ValueError):
        return False
    return pos + size == data_size // 2
