"""Canonical conversation messages: immutable, append-only, deterministically encoded.

A message's bytes (``encode``) are the identity the store keys on and the unit the
prefix-stability invariant compares, so the encoding is canonical JSON: sorted keys,
no whitespace, UTF-8, and fields at their default value left out.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import attrs

Role = Literal["system", "user", "assistant", "tool"]
# Where a message came from; a runtime message is projected with role "user" but is not user input.
Origin = Literal["user", "runtime", "assistant", "tool"]


@attrs.frozen
class ReplayState:
    """Opaque continuation state a provider asked to get back (reasoning_content, encrypted
    reasoning items, thinking signatures). Only the adapter of ``provider_kind`` reads ``data``."""

    provider_kind: str
    data: str  # JSON text owned by the adapter


@attrs.frozen
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
    # Memo of encode()/id: a message is immutable and large histories re-hash every checkpoint.
    _memo: dict[str, bytes] = attrs.field(factory=dict, init=False, eq=False, repr=False, hash=False)

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
        data = self._memo.get("encoded")
        if data is None:
            data = self._memo["encoded"] = canonical_json(self.to_json_obj())
        return data

    @property
    def id(self) -> bytes:
        digest = self._memo.get("id")
        if digest is None:
            digest = self._memo["id"] = hashlib.sha256(self.encode()).digest()
        return digest

    @classmethod
    def decode(cls, data: bytes) -> Message:
        obj = json.loads(data)
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
