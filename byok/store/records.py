"""Values the store hands out and takes in. Plain frozen attrs: no database handles leak out."""

from __future__ import annotations

from typing import Literal

import attrs

from byok.model.body import Body
from byok.model.messages import Message
from byok.model.request import RenderedRequest
from byok.model.usage import Usage

RunStatus = Literal["running", "success", "error", "canceled"]
TERMINAL_RUN_STATUSES: frozenset[str] = frozenset({"success", "error", "canceled"})
LlmCallStatus = Literal["ok", "error", "canceled"]


@attrs.frozen
class Head:
    """A conversation's current history. ``version`` is the compare-and-swap token for the next write;
    an unknown conversation is version 0 with no revision and no messages."""

    conversation_id: str
    revision_id: int | None
    version: int
    messages: tuple[Message, ...]


@attrs.frozen
class RunRecord:
    request_id: str
    conversation_id: str
    model_id: str
    status: RunStatus
    started_at_ms: int
    ended_at_ms: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    usage: Usage | None = None


@attrs.frozen
class BodyBase:
    """A request body starts with the first ``shared_bytes`` bytes of call ``record_id``'s body
    (an earlier call of the same conversation): the store keeps only the rest."""

    record_id: int
    shared_bytes: int


@attrs.frozen
class ComparedPrefix:
    """What a later call is checked against instead of a stored body: the row, and the body's
    compared prefix (LlmCallRecord.compared_*; all None when the row has none)."""

    record_id: int
    size: int | None
    messages: int | None
    sha256: bytes | None


@attrs.frozen
class LlmCallRecord:
    """One provider call (all its attempts), as sent and as it ended. ``request_body`` is already
    redacted by the caller; the hashes are of what was really sent. Timings and counts are those of
    the last attempt; ``queue_ms`` runs from the run deciding to call to that attempt's request.

    Fields after ``usage`` came with schema version 2 and are NULL on older rows:
    ``error_kind`` is one of http_4xx, http_5xx (http_Nxx for other statuses), rate_limited,
    connection, stream_error, protocol, canceled; ``prefix_extends`` says whether this call's
    messages start with all of the previous call's (same conversation), None for a first call;
    ``common_prefix_messages`` counts the leading messages both share; ``cache_hit_share`` is
    cache_read / input tokens (input already includes cached tokens), None when no cache counts
    were reported; ``response_capture`` holds the raw response bytes in detailed mode only.
    A record read back holds its body as bytes; one on its way to the store may hold the
    render's pieces (model/body.py), which the store joins only to keep the body whole.
    """

    request_id: str
    conversation_id: str
    provider_id: str
    model: str
    request_body: Body | None
    request_sha256: str
    messages_sha256: str
    status: LlmCallStatus
    started_at_ms: int
    duration_ms: int | None = None
    error: str | None = None
    http_status: int | None = None
    ttfb_ms: int | None = None
    ttft_ms: int | None = None
    event_count: int = 0
    byte_count: int = 0
    usage: Usage | None = None
    queue_ms: int | None = None
    attempts: int | None = None
    error_kind: str | None = None
    prefix_extends: bool | None = None
    common_prefix_messages: int | None = None
    cache_hit_share: float | None = None
    response_capture: bytes | None = attrs.field(default=None, repr=False)
    # Schema version 6: the body's first ``compared_bytes`` bytes run through its last compared
    # message (what precedes the message array, then the array's elements); how many messages
    # that is, and those bytes' SHA-256. After a restart the next call is checked against them
    # instead of reading this body back. None when the body is not stored as sent (redacted).
    compared_bytes: int | None = None
    compared_messages: int | None = None
    compared_sha256: bytes | None = attrs.field(default=None, repr=False)
    # Schema version 9: the byok model that served the call, and the alias Cursor picked (None
    # when it picked the model itself).
    model_id: str | None = None
    alias_id: str | None = None
    # Not stored: the render ``request_body`` came from, so the call log hashes the meter's
    # elements without parsing the body. Dropped once the record is finalized.
    rendered: RenderedRequest | None = attrs.field(default=None, repr=False, eq=False)
    # How the body is (to be) stored; ``request_body`` is always the whole body (store/call_bodies.py).
    body_base: BodyBase | None = attrs.field(default=None, eq=False)
    # Not stored: the run started a new prefix on purpose (the first call after a compaction), so
    # a call that does not extend the call before is no cache miss (prefix_extends stays None).
    new_prefix: bool = attrs.field(default=False, eq=False)
    # Assigned by the store; None on a record that has not been written yet.
    id: int | None = None


@attrs.frozen
class BlobEdge:
    """``parent_id`` references ``child_id`` as its ``ordinal``-th child of ``kind``."""

    parent_id: bytes
    child_id: bytes
    kind: str
    ordinal: int
