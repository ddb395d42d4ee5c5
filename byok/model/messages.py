"""Canonical conversation messages: immutable, append-only, deterministically encoded.

A message's bytes (``encode``) are the identity the store keys on and the unit the
prefix-stability invariant compares, so the encoding is canonical JSON: sorted keys,
no whitespace, UTF-8, and fields at their default value left out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from sys import intern
from typing import Any, Literal, TypeVar

import attrs

from byok.model.images import ImagePart

T = TypeVar("T")

Role = Literal["system", "user", "assistant", "tool"]
# Where a message came from; a runtime message is projected with role "user" but is not user input,
# and a summary (role "user") stands for the history a compaction replaced (loop/compaction.py).
Origin = Literal["user", "runtime", "summary", "assistant", "tool"]


@attrs.frozen(cache_hash=True)  # hashed for every history item's cache lookup, every call
class ReplayState:
    """Opaque continuation state a provider asked to get back (reasoning_content, encrypted
    reasoning items, thinking signatures). Only the adapter of ``provider_kind`` reads ``data``."""

    provider_kind: str
    data: str  # JSON text owned by the adapter


@attrs.frozen(cache_hash=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # the exact JSON text the model produced
    index: int  # the provider's original position of the call in its response


@attrs.frozen
class Message:
    role: Role
    origin: Origin
    text: str = ""
    thinking: str = ""  # display reasoning; never replay state
    replay: ReplayState | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    # Set on tool-result messages.
    tool_call_id: str = ""
    tool_name: str = ""
    is_error: bool = False
    # Durable grouping of an assistant tool batch and its results (see loop/tool_round).
    tool_round_id: str = ""
    completion_seq: int = 0
    # Stable identity of the runtime event that produced this message (exactly-once append).
    event_id: str = ""
    # Provider model call that produced an assistant message (observability only).
    model_call_id: str = ""
    # Images the message carries (pasted into the user's message, or a Read of an image file).
    # Encoded as references (model/images.py); the bytes live in the store's blob table.
    attachments: tuple[ImagePart, ...] = ()
    # Values derived from this immutable message and kept with it, as large histories re-hash
    # every checkpoint and re-project every turn: its id (SHA-256 of encode(); a stored row's
    # key when decoded), its projected history item, and the rarer memos (encode() itself, the
    # span of the text inside it, a projected prefix) in a dict made on first use. Two slots and
    # no dict for the common case: a dict per decoded message was 0.9 MiB at 5,000 messages.
    _id: bytes | None = attrs.field(default=None, init=False, eq=False, repr=False, hash=False)
    _item: Any = attrs.field(default=None, init=False, eq=False, repr=False, hash=False)
    _memo: dict[str, Any] | None = attrs.field(default=None, init=False, eq=False, repr=False, hash=False)
    # A message read back from SQLite (``stored``): its row's bytes and the string table it shares
    # with the rows read together, until a field is first read; None once decoded, and always for
    # a message made in this process.
    _stored: tuple[bytes, Callable[[Any, Any], Any]] | None = attrs.field(
        default=None, init=False, eq=False, repr=False, hash=False
    )

    @classmethod
    def stored(cls, message_id: bytes, data: bytes, one: Callable[[Any, Any], Any] | None = None) -> Message:
        """The message ``data`` (a stored row, ``message_id`` its key) encodes, decoded when one of
        its fields is first read. A long history read back whole is mostly never looked at: its
        ids make the checkpoints, a stored render stands for its projection (5,000 messages
        decoded: 64 ms, of which 36 ms json.loads). ``one``: a ``dict.setdefault`` shared by the
        rows read together (see ``_from_obj``)."""
        message = object.__new__(cls)
        init = object.__setattr__
        init(message, "_id", message_id)
        init(message, "_item", None)
        init(message, "_memo", None)
        init(message, "_stored", (data, {}.setdefault if one is None else one))
        return message

    def __getattr__(self, name: str) -> Any:
        # Reached only for a slot never set: a stored message's fields before its first read.
        stored = object.__getattribute__(self, "_stored")
        if stored is None or name not in _FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        data, one = stored
        self._take(type(self)._values(json.loads(data), one))
        return object.__getattribute__(self, name)

    def _take(self, values: tuple[Any, ...]) -> None:
        init = object.__setattr__
        for field, value in zip(_FIELDS, values, strict=True):
            init(self, field, value)
        init(self, "_stored", None)  # last: another thread may be reading meanwhile

    @classmethod
    def load_stored(cls, messages: Sequence[Message]) -> None:
        """Decode the stored messages of ``messages`` not decoded yet, with one JSON parse for
        all of them: a history read whole pays json.loads' per-call cost once. When the rows do
        not join into one array of as many objects, each is left to fail on its own first read."""
        pending = [m for m in messages if m._stored is not None]
        if len(pending) < 2:
            return
        try:
            objs = json.loads(b"[" + b",".join([m._stored[0] for m in pending]) + b"]")  # type: ignore[index]
        except ValueError:
            return
        if not isinstance(objs, list) or len(objs) != len(pending):
            return
        for m, obj in zip(pending, objs, strict=True):
            m._take(cls._values(obj, m._stored[1]))  # type: ignore[index]

    def give_image_data(self, data_of: Callable[[str], bytes]) -> None:
        """Give this message's image parts their bytes (``data_of(sha256)``). Only for a message
        just read back from the store, before anyone else sees it: the parts stay equal (their
        bytes are not part of their identity), so the message does too."""
        parts = tuple(p.with_data(data_of(p.sha256)) for p in self.attachments)
        object.__setattr__(self, "attachments", parts)

    @property
    def stored_size(self) -> int | None:
        """Bytes of the row a stored message still holds undecoded; None once decoded."""
        stored = self._stored
        return None if stored is None else len(stored[0])

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"role": self.role, "origin": self.origin}
        if self.attachments:
            # "attachments" sorts first in the canonical encoding: the store tells the rows that
            # carry images by their first bytes (ATTACHMENTS_PREFIX), without parsing the rest.
            obj["attachments"] = [p.to_json() for p in self.attachments]
        if self.text:
            obj["text"] = self.text
        if self.thinking:
            obj["thinking"] = self.thinking
        if self.replay is not None:
            obj["replay"] = {"provider_kind": self.replay.provider_kind, "data": self.replay.data}
        if self.tool_calls:
            obj["tool_calls"] = [
                {"call_id": c.call_id, "name": c.name, "arguments": c.arguments, "index": c.index}
                for c in self.tool_calls
            ]
        for key in ("tool_call_id", "tool_name", "tool_round_id", "event_id", "model_call_id"):
            value = getattr(self, key)
            if value:
                obj[key] = value
        if self.is_error:
            obj["is_error"] = True
        if self.completion_seq:
            obj["completion_seq"] = self.completion_seq
        return obj

    def encode(self) -> bytes:
        stored = self._stored
        if stored is not None:
            return stored[0]  # the row is this very encoding (its key is its SHA-256)
        data: bytes | None = self.memo_get("encoded")
        if data is None:
            data = self._encode()
            self.memo_set("encoded", data)
        return data

    def _encode(self) -> bytes:
        obj = self.to_json_obj()
        if len(self.text) >= SPLICE_MIN:
            # The rest is encoded around a hole and the text escaped by json_string, not by
            # json.dumps; where it sits is remembered, so other JSON encodings of this message
            # (its checkpoint root) splice it in instead of escaping megabytes again.
            around = _around_hole({**obj, "text": _HOLE})
            if around is not None:
                head, tail = around
                text_json = json_string(self.text)
                self.memo_set("text_span", (len(head), len(head) + len(text_json)))
                return b"".join((head, text_json, tail))
        return canonical_json(obj)

    def text_json(self) -> bytes | memoryview:
        """UTF-8 of ``json.dumps(self.text, ensure_ascii=False)``; for a large text, a view into
        encode() (escaped once, and no second copy kept)."""
        if len(self.text) < SPLICE_MIN:
            return json_string(self.text)
        data = self.encode()
        span = self.memo_get("text_span")
        if span is None:
            return json_string(self.text)
        return memoryview(data)[span[0] : span[1]]

    @property
    def id(self) -> bytes:
        digest = self._id
        if digest is None:
            digest = hashlib.sha256(self.encode()).digest()
            object.__setattr__(self, "_id", digest)
        return digest

    def memo_get(self, key: str) -> Any:
        memo = self._memo
        return None if memo is None else memo.get(key)

    def memo_set(self, key: str, value: Any) -> None:
        memo = self._memo
        if memo is None:
            memo = {}
            object.__setattr__(self, "_memo", memo)
        memo[key] = value

    def memo_pop(self, key: str) -> None:
        if self._memo is not None:
            self._memo.pop(key, None)

    def decodes_to_itself(self) -> bool:
        """True when ``Message.decode(self.encode()) == self``: every field holds exactly its
        declared type (JSON keeps str, int, bool, tuples of ToolCall; defaults are omitted and
        come back as defaults). Lets the store return the caller's message instead of decoding
        what it just encoded (property-tested against decode)."""
        strs = (
            self.role,
            self.origin,
            self.text,
            self.thinking,
            self.tool_call_id,
            self.tool_name,
            self.tool_round_id,
            self.event_id,
            self.model_call_id,
        )
        replay = self.replay
        return (
            type(self) is Message
            and all(type(v) is str for v in strs)
            and type(self.is_error) is bool
            and type(self.completion_seq) is int
            and (
                replay is None
                or (
                    type(replay) is ReplayState
                    and type(replay.provider_kind) is str
                    and type(replay.data) is str
                )
            )
            and type(self.tool_calls) is tuple
            and all(
                type(c) is ToolCall
                and type(c.call_id) is str
                and type(c.name) is str
                and type(c.arguments) is str
                and type(c.index) is int
                for c in self.tool_calls
            )
            and type(self.attachments) is tuple
            and all(
                type(p) is ImagePart
                and type(p.media_type) is str
                and type(p.sha256) is str
                and type(p.size) is int
                for p in self.attachments
            )
        )

    def history_item(self, make: Callable[..., T], *args: Any) -> T:
        """``make(self, *args)``, computed once and kept with this message: its provider-neutral
        history item (see projection)."""
        value = self._item
        if value is None:
            value = make(self, *args)
            object.__setattr__(self, "_item", value)
        return value  # type: ignore[no-any-return]

    @property
    def encoded_size(self) -> int:
        """Bytes of encode() this message holds, 0 when it has not been encoded."""
        data = self.memo_get("encoded")
        return 0 if data is None else len(data)

    @classmethod
    def decode(cls, data: bytes, *, id: bytes | None = None) -> Message:
        """The message ``data`` encodes. ``id``: the SHA-256 of ``data`` when the caller has it
        (a stored row's key), so ``.id`` need not encode and hash the message again."""
        message = cls._from_obj(json.loads(data), {}.setdefault)
        if id is not None:
            object.__setattr__(message, "_id", id)
        return message

    @classmethod
    def _from_obj(cls, obj: Any, one: Callable[[Any, Any], Any]) -> Message:
        """``one``: a ``dict.setdefault`` shared by the messages decoded together, so each
        distinct round id and tool call id is one string object (a round's id recurs in each of
        its results, a call id in its result); roles and tool names are interned. json.loads
        makes a new string for every occurrence: at 5,000 messages these copies were 1.1 MiB of
        a 9 MiB history."""
        return cls(*cls._values(obj, one))

    @classmethod
    def _values(cls, obj: Any, one: Callable[[Any, Any], Any]) -> tuple[Any, ...]:
        """The field values of the message ``obj`` (a parsed row) holds, in field order."""
        try:
            return cls._build(obj, one, intern)
        except TypeError:  # a badly typed row (an unhashable id, a non-string role): as it is
            return cls._build(obj, _same, _same)

    @classmethod
    def _build(cls, obj: Any, one: Callable[[Any, Any], Any], name: Callable[[Any], Any]) -> tuple[Any, ...]:
        # Positional, in field order, and no lookups for empty values: a 5,000-message history
        # is built in 14.5 ms instead of 18.5. Odd values (a row we did not write) come back as
        # they were stored.
        get = obj.get
        replay = get("replay")
        calls = get("tool_calls", _ABSENT)
        call_id = get("tool_call_id", "")
        tool_name = get("tool_name", "")
        round_id = get("tool_round_id", "")
        images = get("attachments", _ABSENT)
        return (
            name(obj["role"]),
            name(obj["origin"]),
            get("text", ""),
            get("thinking", ""),
            ReplayState(name(replay["provider_kind"]), replay["data"]) if replay else None,
            tuple(
                [
                    ToolCall(one(c["call_id"], c["call_id"]), name(c["name"]), c["arguments"], c["index"])
                    for c in calls
                ]
            )
            if calls is not _ABSENT
            else (),
            one(call_id, call_id) if call_id else call_id,
            name(tool_name) if tool_name else tool_name,
            get("is_error", False),
            one(round_id, round_id) if round_id else round_id,
            get("completion_seq", 0),
            get("event_id", ""),
            get("model_call_id", ""),
            tuple([ImagePart.from_json(p) for p in images]) if images is not _ABSENT else (),
        )


_ABSENT: Any = object()
# How the encoding of a message with images starts (its first key, see to_json_obj).
ATTACHMENTS_PREFIX = b'{"attachments":'
# The fields a stored message decodes on first read.
_FIELDS = tuple(f.name for f in attrs.fields(Message) if f.init)


def _same(value: Any, *_: Any) -> Any:
    return value


def join_surrogates(text: str) -> str:
    """Pair UTF-16 surrogates that arrived in separate JSON deltas ("\\ud83d" then "\\ude00");
    a lone one left over becomes U+FFFD so the text always encodes as UTF-8."""
    if not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# Texts at least this long are JSON-escaped once per message and spliced into each encoding.
SPLICE_MIN = 16 * 1024
# Stands in for the large text while the small rest of an object is encoded. Any other
# occurrence of it in the output makes splice_json fall back to encoding everything.
_HOLE = "\ue000byok:text\ue001"
_HOLE_JSON = json.dumps(_HOLE, ensure_ascii=False).encode()


# Texts this long or longer are escaped with bytes.replace passes (memchr and memcpy in C) instead
# of json's escaper (~2 ns a character): below it the passes' fixed cost, a call per escaped byte
# value, is the larger.
_REPLACE_MIN = 4096
# What JSON escapes with ensure_ascii=False, as (byte, its escape). The backslash goes first, as
# the others add backslashes. Every one of these bytes is ASCII, so in UTF-8 it stands only for
# itself.
_TWO_CHAR_ESCAPES = {0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n", 0x0C: b"\\f", 0x0D: b"\\r"}
_ESCAPES: tuple[tuple[bytes, bytes], ...] = (
    (b"\\", b"\\\\"),
    (b'"', b'\\"'),
    *((bytes([c]), _TWO_CHAR_ESCAPES.get(c, b"\\u%04x" % c)) for c in range(0x20)),
)
_ESCAPED_BYTES = b"".join(byte for byte, _ in _ESCAPES)
# A pass costs ~20 ns per escape it makes, so a text where more than one byte in _DENSE needs an
# escape is left to json's escaper. Judged on _SAMPLES spread windows of _WINDOW characters.
_DENSE = 10
_SAMPLES = 4
_WINDOW = 256


def json_string(text: str) -> bytes:
    """``json.dumps(text, ensure_ascii=False).encode()``, and the same exception where that raises
    (UnicodeEncodeError for a lone surrogate)."""
    if len(text) >= _REPLACE_MIN and _few_escapes(text):
        return b"".join((b'"', _escaped(text.encode()), b'"'))
    # What json.dumps calls for a str with ensure_ascii=False, without building a JSONEncoder
    # each time (a third of the time of a 200-character text).
    return encode_basestring(text).encode()


def _escaped(data: bytes) -> bytes:
    for byte, escape in _ESCAPES:
        data = data.replace(byte, escape)  # the same object back when the byte is absent
    return data


def _few_escapes(text: str) -> bool:
    """Whether few enough of the text's UTF-8 bytes need an escape, judged on samples (a lone
    surrogate in them raises UnicodeEncodeError here, as the reference would)."""
    step = max(len(text) // _SAMPLES, _WINDOW)
    sample = "".join([text[i : i + _WINDOW] for i in range(0, len(text), step)]).encode()
    return _DENSE * (len(sample) - len(sample.translate(None, _ESCAPED_BYTES))) <= len(sample)


def _around_hole(obj: Any) -> tuple[bytes, bytes] | None:
    """``canonical_json(obj)`` before and after the hole's JSON, when that occurs in it once.
    The JSON of a string does not depend on what else the object holds, so then the same object
    with a text in the hole's place encodes to ``head + json_string(text) + tail``. (Two
    occurrences could overlap only in a closing quote followed by U+E000, which JSON never writes.)"""
    head, hole, tail = canonical_json(obj).partition(_HOLE_JSON)
    if not hole or _HOLE_JSON in tail:
        return None
    return head, tail


def splice_json(build: Callable[[str], Any], text: str, text_json: bytes | memoryview) -> bytes:
    """``canonical_json(build(text))`` with ``text_json`` (the JSON of ``text``) spliced in rather
    than escaped again. ``build`` must place its argument verbatim as one JSON string value and
    not depend on it otherwise (text is non-empty, so its truthiness matches the hole's)."""
    around = _around_hole(build(_HOLE))
    if not text or around is None:
        return canonical_json(build(text))
    return b"".join((around[0], text_json, around[1]))
