"""Canonical conversation messages: immutable, append-only, deterministically encoded.

A message's bytes (``encode``) are the identity the store keys on and the unit the
prefix-stability invariant compares, so the encoding is canonical JSON: sorted keys,
no whitespace, UTF-8, and fields at their default value left out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import attrs

T = TypeVar("T")

Role = Literal["system", "user", "assistant", "tool"]
# Where a message came from; a runtime message is projected with role "user" but is not user input.
Origin = Literal["user", "runtime", "assistant", "tool"]


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
    # Memo of derived encodings (encode(), id, the span of text inside encode()): a message is
    # immutable, and large histories re-hash every checkpoint.
    _memo: dict[str, Any] = attrs.field(factory=dict, init=False, eq=False, repr=False, hash=False)

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"role": self.role, "origin": self.origin}
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
        data: bytes | None = self._memo.get("encoded")
        if data is None:
            data = canonical_json(self.to_json_obj())
            if len(self.text) >= SPLICE_MIN:
                # Remember where the escaped text sits, so other JSON encodings of this message
                # (its checkpoint root) splice it in instead of escaping megabytes again.
                span = _text_span(lambda text: {**self.to_json_obj(), "text": text}, data)
                if span is not None:
                    self._memo["text_span"] = span
            self._memo["encoded"] = data
        return data

    def text_json(self) -> bytes | memoryview:
        """UTF-8 of ``json.dumps(self.text, ensure_ascii=False)``; for a large text, a view into
        encode() (escaped once, and no second copy kept)."""
        if len(self.text) < SPLICE_MIN:
            return json_string(self.text)
        data = self.encode()
        span = self._memo.get("text_span")
        if span is None:
            return json_string(self.text)
        return memoryview(data)[span[0] : span[1]]

    @property
    def id(self) -> bytes:
        digest = self._memo.get("id")
        if digest is None:
            digest = self._memo["id"] = hashlib.sha256(self.encode()).digest()
        return digest

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
        )

    def derived(self, key: str, make: Callable[..., T], *args: Any) -> T:
        """``make(self, *args)``, computed once from this (immutable) message and kept with it
        under ``key`` (e.g. its provider-neutral history item)."""
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = make(self, *args)
        return value  # type: ignore[no-any-return]

    @property
    def encoded_size(self) -> int:
        """Bytes of encode() this message holds, 0 when it has not been encoded."""
        data = self._memo.get("encoded")
        return 0 if data is None else len(data)

    @classmethod
    def decode(cls, data: bytes, *, id: bytes | None = None) -> Message:
        """The message ``data`` encodes. ``id``: the SHA-256 of ``data`` when the caller has it
        (a stored row's key), so ``.id`` need not encode and hash the message again."""
        message = cls._decode(data)
        if id is not None:
            message._memo["id"] = id
        return message

    @classmethod
    def decode_many(cls, rows: Sequence[tuple[bytes, bytes]]) -> tuple[Message, ...]:
        """``decode(data, id=id)`` of each ``(id, data)`` row, with one JSON parse for all of them:
        a history read back whole (5,000 messages) pays json.loads' per-call overhead once. Rows
        that do not join into one array of as many objects are decoded one by one, so a bad row
        fails exactly as ``decode`` would."""
        if not rows:
            return ()
        try:
            objs = json.loads(b"[" + b",".join(data for _, data in rows) + b"]")
        except ValueError:
            objs = None
        if not isinstance(objs, list) or len(objs) != len(rows):
            return tuple(cls.decode(data, id=message_id) for message_id, data in rows)
        out = []
        for (message_id, _), obj in zip(rows, objs, strict=True):
            message = cls._from_obj(obj)
            message._memo["id"] = message_id
            out.append(message)
        return tuple(out)

    @classmethod
    def _decode(cls, data: bytes) -> Message:
        return cls._from_obj(json.loads(data))

    @classmethod
    def _from_obj(cls, obj: Any) -> Message:
        replay = obj.get("replay")
        return cls(
            role=obj["role"],
            origin=obj["origin"],
            text=obj.get("text", ""),
            thinking=obj.get("thinking", ""),
            replay=ReplayState(replay["provider_kind"], replay["data"]) if replay else None,
            tool_calls=tuple(
                ToolCall(c["call_id"], c["name"], c["arguments"], c["index"])
                for c in obj.get("tool_calls", ())
            ),
            tool_call_id=obj.get("tool_call_id", ""),
            tool_name=obj.get("tool_name", ""),
            is_error=obj.get("is_error", False),
            tool_round_id=obj.get("tool_round_id", ""),
            completion_seq=obj.get("completion_seq", 0),
            event_id=obj.get("event_id", ""),
            model_call_id=obj.get("model_call_id", ""),
        )


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


def json_string(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False).encode()


def _text_span(build: Callable[[str], Any], data: bytes) -> tuple[int, int] | None:
    """Where the JSON of the text sits in ``data == canonical_json(build(text))``: everything
    around it is what the same object encodes to with the hole in its place."""
    head, hole, tail = canonical_json(build(_HOLE)).partition(_HOLE_JSON)
    end = len(data) - len(tail)
    if not hole or _HOLE_JSON in tail or not (data.startswith(head) and data.endswith(tail)):
        return None
    return len(head), end


def splice_json(build: Callable[[str], Any], text: str, text_json: bytes | memoryview) -> bytes:
    """``canonical_json(build(text))`` with ``text_json`` (the JSON of ``text``) spliced in rather
    than escaped again. ``build`` must place its argument verbatim as one JSON string value and
    not depend on it otherwise (text is non-empty, so its truthiness matches the hole's)."""
    head, hole, tail = canonical_json(build(_HOLE)).partition(_HOLE_JSON)
    if not text or not hole or _HOLE_JSON in tail:
        return canonical_json(build(text))
    return b"".join((head, text_json, tail))
