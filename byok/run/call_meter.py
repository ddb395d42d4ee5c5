"""What a provider-call record derives and measures, as pure functions the call-log writer
(call_log) runs on its finalize thread: the body's hashes and redacted stored form, the
cache-hit share, how a failed call failed, and the prefix meter.

The prefix meter: does this call's message list extend the previous call's (same conversation)
message for message? Messages are compared as serialized bytes: each element of the request's
message array (Chat: ``messages``; Responses: ``instructions`` as element 0, then ``input``;
Anthropic: ``system`` as element 0, then ``messages``) is hashed as its JSON text exactly as
sent, so a changed system prompt counts as a broken prefix. The adapters hand over those texts
with the body (``RenderedRequest``), and each text's hash is memoised, so a call costs what its
new messages cost, not the whole body. A stored body that was redacted no longer holds what was
sent: the call after it is not compared (None).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence

import attrs
import httpx
import trio

from byok.loop.model_call import ModelProtocolError
from byok.model.body import Body, as_bytes, chunks, view
from byok.model.events import ProviderError
from byok.model.usage import Usage
from byok.providers.fragment_cache import SizedLru
from byok.providers.rendering import split_body
from byok.run.body_chain import BodyLayout, compared_end, layout_of
from byok.run.redaction import REDACTED, may_hold_secret, redact_body
from byok.store import ComparedPrefix, LlmCallRecord

# Element bytes -> (their SHA-256, whether they may hold a secret key). Keyed by the adapters'
# cached texts, so a long conversation hashes only its new messages. The finalize threads of
# several CallLogs may share it.
ELEMENT_DIGESTS: SizedLru[bytes, tuple[bytes, bool]] = SizedLru(24 * 2**20, lambda text, _: len(text) + 150)
# A conversation's own digests (the call log's records name it): they go with its other caches
# when the daemon's cache budget evicts it (run/conversation_caches.py). Each bounded by
# ``_owned_max`` (the daemon sets its budget).
_OWNED_DIGESTS: dict[str, SizedLru[bytes, tuple[bytes, bool]]] = {}
_owned_max = [256 * 2**20]
_DIGESTS_LOCK = threading.Lock()


def set_owned_max_bytes(max_bytes: int) -> None:
    with _DIGESTS_LOCK:
        _owned_max[0] = max_bytes
        for cache in _OWNED_DIGESTS.values():
            cache.max_bytes = max_bytes


def forget_element_digests(owner: str | None = None) -> None:
    """Drop ``owner``'s digests; every digest when None."""
    with _DIGESTS_LOCK:
        if owner is None:
            ELEMENT_DIGESTS.clear()
            _OWNED_DIGESTS.clear()
        else:
            _OWNED_DIGESTS.pop(owner, None)


def digests_size(owner: str) -> int:
    """What ``owner``'s digests count for: the entries' own bytes (their texts are the request
    fragments, charged with the render)."""
    with _DIGESTS_LOCK:
        cache = _OWNED_DIGESTS.get(owner)
        return 0 if cache is None else 150 * len(cache)


def element_digests(
    elements: Sequence[bytes], memo: bool = True, owner: str | None = None
) -> tuple[tuple[bytes, ...], bool]:
    """Each element's SHA-256 (of its JSON bytes as sent), and whether any may hold a secret.
    ``memo=False`` for elements cut from a body: caching them would pin a copy of the history.
    ``owner``: the conversation whose cache keeps them (else the shared one)."""
    if not memo:
        digests = tuple(hashlib.sha256(e).digest() for e in elements)
        return digests, any(may_hold_secret(e) for e in elements)
    out: list[bytes] = []
    secret = False
    with _DIGESTS_LOCK:
        cache = ELEMENT_DIGESTS
        if owner is not None:
            cache = _OWNED_DIGESTS.get(owner) or _OWNED_DIGESTS.setdefault(
                owner, SizedLru(_owned_max[0], lambda text, _: len(text) + 150)
            )
        for text in elements:
            hit = cache.get(text)
            if hit is None:
                hit = (hashlib.sha256(text).digest(), may_hold_secret(text))
                cache.put(text, hit)
            out.append(hit[0])
            secret = secret or hit[1]
    return tuple(out), secret


def message_hashes(body: bytes | None) -> tuple[bytes, ...] | None:
    """SHA-256 of each compared element's JSON text as it appears in ``body``; None when
    unknown (no body, not JSON, no message array)."""
    split = None if body is None else split_body(body)
    if split is None or split.elements is None:
        return None
    # Not memoised: cut from a body, they would pin a copy of the history.
    return tuple(hashlib.sha256(e).digest() for e in split.elements)


_REDACTED_JSON = b'"' + REDACTED.encode() + b'"'


def stored_message_hashes(body: bytes | None) -> tuple[bytes, ...] | None:
    """message_hashes of a stored request body; None (unknown) when it was redacted, since its
    elements may then differ from what was sent, which is what the meter compares."""
    if body is None or _REDACTED_JSON in body:
        return None
    return message_hashes(body)


def compare_prefix(
    previous: Sequence[bytes] | None, current: Sequence[bytes] | None
) -> tuple[bool | None, int | None]:
    """(prefix_extends, common_prefix_messages): whether ``current`` starts with all of
    ``previous``, and how many leading messages they share. (None, None) for a first call or
    when either side is unknown."""
    if previous is None or current is None:
        return None, None
    common = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        common += 1
    return common == len(previous), common


def cache_hit_share(usage: Usage | None) -> float | None:
    """cache_read / input. byok's input_tokens already includes cached reads and writes
    (Anthropic: input + cache_read + cache_creation), so it is the denominator as is. None
    when the provider reported no cache counts."""
    if usage is None or (usage.cache_read_tokens is None and usage.cache_write_tokens is None):
        return None
    if usage.input_tokens <= 0:
        return None
    return (usage.cache_read_tokens or 0) / usage.input_tokens


def error_kind(exc: BaseException | None, http_status: int | None = None) -> str | None:
    """Classify how a provider call failed: http_4xx, http_5xx (http_Nxx for other statuses),
    rate_limited, connection, stream_error, protocol, canceled, internal. ``http_status`` is the
    response status of the attempt the call ended with, if it got one."""
    if exc is None:
        return None
    if isinstance(exc, trio.Cancelled):
        return "canceled"
    if isinstance(exc, ProviderError):
        status = http_status
        if status is None and exc.message.startswith("HTTP "):
            status = exc.status
        if status is not None and not 200 <= status < 300:
            return "rate_limited" if status == 429 else f"http_{status // 100}xx"
        if isinstance(exc.__cause__, httpx.RequestError):
            return "connection"
        if exc.message.startswith(("provider error in stream", "response failed")):
            return "rate_limited" if exc.status == 429 else "stream_error"
        return "protocol"  # truncated stream, bad JSON, JSON instead of a stream, cut off...
    if isinstance(exc, ModelProtocolError):
        return "protocol"
    return "internal"


def finalize_and_hash(rec: LlmCallRecord) -> tuple[LlmCallRecord, tuple[bytes, ...] | None]:
    """Fill in what is derived from the request body (the model name, the hashes of what was
    really sent, the redacted body that is stored) and return the prefix meter's hashes of the
    sent elements beside it. With the render the body came from, nothing is parsed: the
    elements' hashes are memoised, the two whole-body hashes run without the GIL, and only a
    body that may hold a secret key is parsed for redaction. Without one (a body from
    elsewhere) the body is walked once for its elements."""
    done = finalize_with_layout(rec)
    return done.record, done.hashes


@attrs.frozen
class Finalized:
    record: LlmCallRecord
    hashes: tuple[bytes, ...] | None  # the prefix meter's, of the elements as sent
    # The stored body's layout, when a later call may store its own body as a tail of it (not
    # when redaction changed what is stored).
    layout: BodyLayout | None
    # What the meter compares besides the message array's bytes: its elements outside the
    # array (instructions, system), which a body need not put before the array.
    mark: bytes = b""


def finalize_with_layout(rec: LlmCallRecord) -> Finalized:
    """finalize_and_hash, plus the stored body's layout and its compared prefix
    (``LlmCallRecord.compared_*``). A body spliced from the render's pieces stays in pieces:
    it is hashed in one pass over them, and joined only if it must be redacted."""
    if rec.request_sha256 or rec.request_body is None:
        body_bytes = None if rec.request_body is None else as_bytes(rec.request_body)
        return Finalized(attrs.evolve(rec, rendered=None), message_hashes(body_bytes), None)
    body = rec.request_body
    shape = rec.rendered
    ours = shape is not None and (shape.source is body or shape.body is body)
    if not ours:
        shape = split_body(as_bytes(body))
    hashes: tuple[bytes, ...] | None = None
    secret = True
    array = None
    mark = b""
    if shape is not None and shape.elements is not None and shape.array is not None:
        hashes, secret = element_digests(shape.elements, memo=ours, owner=rec.conversation_id or None)
        mark = head_mark(hashes[: shape.head])
        array = start, end = shape.array
        if not secret:  # the elements are checked; the rest of the body is small
            secret = may_hold_secret(bytes(view(body, 0, start)) + bytes(view(body, end, len(body))))
    stored = redact_body(as_bytes(body)) if secret else body
    layout = None
    if stored is body and shape is not None and hashes is not None:
        layout = layout_of(body, shape, hashes)
    cut = None if layout is None else compared_end(layout)
    # The whole-body hash passes through the compared prefix: its digest costs nothing more.
    whole, messages, prefix = _hash_pass(body, array or (0, 0), cut)
    compared: dict[str, object] = {}
    if prefix is not None and hashes is not None:
        prefix.update(mark)
        compared = {
            "compared_bytes": cut,
            "compared_messages": len(hashes),
            "compared_sha256": prefix.digest(),
        }
    rec = attrs.evolve(
        rec,
        model=rec.model or (shape.model if shape is not None else ""),
        request_body=stored,
        request_sha256=whole.hexdigest(),
        messages_sha256=(messages if array is not None else hashlib.sha256(b"[]")).hexdigest(),
        rendered=None,
        **compared,  # type: ignore[arg-type]
    )
    return Finalized(rec, hashes, layout, mark)


def _hash_pass(
    body: Body, span: tuple[int, int], cut: int | None
) -> tuple[hashlib._Hash, hashlib._Hash, hashlib._Hash | None]:
    """In one pass over ``body``: the SHA-256 of all of it, of its bytes in ``span``, and a copy
    of the first after ``cut`` bytes (None without a cut)."""
    whole, part = hashlib.sha256(), hashlib.sha256()
    at_cut = None
    a, b = span
    pos = 0
    # Spliced: runs of items joined in C. A chunk over 2 KiB is hashed without the GIL.
    for chunk in chunks(body):
        size = len(chunk)
        if pos < b and a < pos + size:
            inside = a <= pos and pos + size <= b
            part.update(chunk if inside else memoryview(chunk)[max(a - pos, 0) : b - pos])
        if cut is not None and at_cut is None and pos <= cut <= pos + size:
            whole.update(memoryview(chunk)[: cut - pos])
            at_cut = whole.copy()
            whole.update(memoryview(chunk)[cut - pos :])
        else:
            whole.update(chunk)
        pos += size
    return whole, part, at_cut


def head_mark(head: Sequence[bytes]) -> bytes:
    return b"head:%d:" % len(head) + b"".join(head)


def extends_compared(body: Body | None, mark: bytes, previous: ComparedPrefix) -> bool:
    """Whether ``body`` (sent with the meter's ``mark``) holds all of ``previous``'s compared
    messages, known from its compared prefix alone. Equal bytes through the previous body's
    last element, then "," or "]", are the same elements at the same places (through its "[",
    when it had none, anything may follow); the mark covers those outside the array. False says
    nothing: the previous body must then be compared."""
    size, digest = previous.size, previous.sha256
    if body is None or size is None or digest is None:
        return False
    if bytes(view(body, size, size + 1)) not in (b",", b"]") and bytes(view(body, size - 1, size)) != b"[":
        return False
    prefix = hashlib.sha256()
    for chunk in chunks(body, 0, size):
        prefix.update(chunk)
    prefix.update(mark)
    return prefix.digest() == digest


def stored_last(body: bytes | None) -> tuple[tuple[bytes, ...] | None, BodyLayout | None]:
    """The meter's hashes and the layout of a stored body (a conversation's last call, read
    after a restart); nothing for a redacted body, which may differ from what was sent."""
    if body is None or _REDACTED_JSON in body:
        return None, None
    shape = split_body(body)
    if shape is None or shape.elements is None:
        return None, None
    # Not memoised: cut from a body, they would pin a copy of the history.
    digests = tuple(hashlib.sha256(e).digest() for e in shape.elements)
    return digests, layout_of(body, shape, digests)
