"""Canonical messages <-> the JSON model messages a checkpoint's root_prompt_messages_json points at.

Cursor stores the model transcript as AI-SDK style JSON messages
(`{"role", "content", "providerOptions"}`). byok writes its own canonical fields that have
no AI-SDK home under `providerOptions.byok`, so a root decodes back to the exact Message
(conversation import relies on that). Encoding is deterministic: same message, same bytes,
same blob id.

A message's images go into its root whole, as AI-SDK image parts (a tool result's as media
parts of a ``content`` output): the client's copy of the transcript is complete on its own, so
a conversation imported from it keeps them.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from byok.model.images import ImageError, ImagePart
from byok.model.messages import SPLICE_MIN, Message, ReplayState, ToolCall, canonical_json, splice_json


class RootJsonError(ValueError):
    pass


def encode_root(message: Message) -> bytes:
    if len(message.text) < SPLICE_MIN:
        return canonical_json(_root_obj(message, message.text))
    # A large text (a Read result) is JSON-escaped once per message: reuse Message.encode()'s.
    return splice_json(lambda text: _root_obj(message, text), message.text, message.text_json())


def _root_obj(message: Message, text: str) -> dict[str, Any]:
    """The root JSON object of ``message`` with ``text`` in place of its text (see splice_json)."""
    content: Any
    if message.role == "assistant":
        parts: list[dict[str, Any]] = []
        if message.thinking:
            parts.append({"type": "reasoning", "text": message.thinking})
        if text:
            parts.append({"type": "text", "text": text})
        for c in message.tool_calls:
            parts.append(
                {"type": "tool-call", "toolCallId": c.call_id, "toolName": c.name, "input": c.arguments}
            )
        content = parts
    elif message.role == "tool":
        output: dict[str, Any] = {"type": "error-text" if message.is_error else "text", "value": text}
        if message.attachments:
            media = [
                {"type": "media", "data": p.base64(), "mediaType": p.media_type} for p in message.attachments
            ]
            output = {"type": "content", "value": [{"type": "text", "text": text}, *media]}
        content = [
            {
                "type": "tool-result",
                "toolCallId": message.tool_call_id,
                "toolName": message.tool_name,
                "output": output,
            }
        ]
    elif message.attachments:
        images = [
            {"type": "image", "image": p.base64(), "mediaType": p.media_type} for p in message.attachments
        ]
        content = [*images, {"type": "text", "text": text}]
    else:
        content = text
    byok: dict[str, Any] = {"origin": message.origin}
    if message.replay is not None:
        byok["replay"] = {"provider_kind": message.replay.provider_kind, "data": message.replay.data}
    if message.tool_calls:
        byok["call_index"] = [c.index for c in message.tool_calls]
    for key in ("tool_round_id", "event_id", "model_call_id"):
        value = getattr(message, key)
        if value:
            byok[key] = value
    if message.completion_seq:
        byok["completion_seq"] = message.completion_seq
    return {"role": message.role, "content": content, "providerOptions": {"byok": byok}}


def decode_root(data: bytes) -> Message:
    """Decode a root JSON message. Roots written by other servers (no providerOptions.byok)
    decode with defaults: origin follows role, no replay state. Any malformed shape is a
    RootJsonError: the caller (conversation import) must fail closed, not crash."""
    try:
        return _decode_root(data)
    except RootJsonError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, RecursionError) as e:
        raise RootJsonError(f"root prompt message is malformed: {type(e).__name__}: {e}") from None


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise RootJsonError(f"root prompt message: {what} must be a string, got {type(value).__name__}")
    return value


def _decode_root(data: bytes) -> Message:
    try:
        obj = json.loads(data)
        role = obj["role"]
        content = obj["content"]
    except (ValueError, KeyError, TypeError) as e:
        raise RootJsonError(f"root prompt message is not a JSON model message: {e}") from None
    if role not in ("system", "user", "assistant", "tool"):
        raise RootJsonError(f"root prompt message has unknown role {role!r}")
    byok = (obj.get("providerOptions") or {}).get("byok") or {}
    replay = byok.get("replay")
    origin = byok.get("origin", {"system": "runtime"}.get(role, role))
    if origin not in ("user", "runtime", "summary", "assistant", "tool"):
        raise RootJsonError(f"root prompt message has unknown origin {origin!r}")
    seq = byok.get("completion_seq", 0)
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise RootJsonError("root prompt message: completion_seq must be an integer")
    common: dict[str, Any] = {
        "origin": origin,
        "replay": (
            ReplayState(
                _str(replay["provider_kind"], "replay.provider_kind"), _str(replay["data"], "replay.data")
            )
            if replay
            else None
        ),
        "tool_round_id": _str(byok.get("tool_round_id", ""), "tool_round_id"),
        "event_id": _str(byok.get("event_id", ""), "event_id"),
        "model_call_id": _str(byok.get("model_call_id", ""), "model_call_id"),
        "completion_seq": seq,
    }
    if isinstance(content, str):
        return Message(role=role, text=content, **common)
    if not isinstance(content, list):
        raise RootJsonError("root prompt message content must be a string or a list of parts")
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    images: list[ImagePart] = []
    indexes = byok.get("call_index") or []
    if not isinstance(indexes, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in indexes
    ):
        raise RootJsonError("root prompt message: call_index must be a list of integers")
    for part in content:
        kind = part.get("type")
        if kind == "text":
            texts.append(_str(part.get("text", ""), "text part"))
        elif kind == "reasoning":
            thinking.append(_str(part.get("text", ""), "reasoning part"))
        elif kind in ("image", "file") and role != "assistant":
            image = _image(part)
            if isinstance(image, ImagePart):
                images.append(image)
            elif image is not None:
                texts.append(image)
        elif kind == "tool-call":
            if role != "assistant":
                # Only an assistant turn calls tools; a Message of another role could not write
                # its calls back, and its root's blob id would change on the next encode.
                raise RootJsonError(f"root prompt message: a tool-call part in a {role} message")
            args = part.get("input", "")
            if not isinstance(args, str):
                args = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            index = indexes[len(calls)] if len(calls) < len(indexes) else len(calls)
            calls.append(
                ToolCall(
                    _str(part["toolCallId"], "toolCallId"), _str(part["toolName"], "toolName"), args, index
                )
            )
        elif kind == "tool-result":
            output = part.get("output") or {}
            value = output.get("value", "")
            result_images: list[ImagePart] = []
            if output.get("type") == "content" and isinstance(value, list):
                value, result_images = _content_output(value)
            elif not isinstance(value, str):
                value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            return Message(
                role=role,
                text=value,
                tool_call_id=_str(part.get("toolCallId", ""), "toolCallId"),
                tool_name=_str(part.get("toolName", ""), "toolName"),
                is_error=output.get("type") in ("error-text", "error-json"),
                attachments=tuple(result_images),
                **common,
            )
    return Message(
        role=role,
        text="".join(texts),
        thinking="".join(thinking),
        tool_calls=tuple(calls),
        attachments=tuple(images),
        **common,
    )


def _content_output(value: list[Any]) -> tuple[str, list[ImagePart]]:
    """A tool result's ``content`` output: its text parts joined, its image media parts."""
    texts: list[str] = []
    images: list[ImagePart] = []
    for p in value:
        if p.get("type") == "text":
            texts.append(_str(p.get("text", ""), "text part"))
        elif p.get("type") == "media":
            image = _image(p)
            if isinstance(image, ImagePart):
                images.append(image)
            elif image is not None:
                texts.append(image)
    return "".join(texts), images


def _image(part: dict[str, Any]) -> ImagePart | str | None:
    """The image of an AI-SDK image, file or media part (base64 or a data URL); None for a file
    that is not an image. An image whose bytes are not there (a URL, another server's reference)
    or that no provider takes becomes a line saying so: the model learns it was there."""
    media_type = str(part.get("mediaType") or part.get("mimeType") or "")
    if part.get("type") != "image" and not media_type.startswith("image/"):
        return None
    data = part.get("image") if part.get("type") == "image" else part.get("data")
    if not isinstance(data, str):
        return "\n[an image of the conversation was not carried over: its bytes are not in the transcript]\n"
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "\n[an image of the conversation was not carried over: it is not inline (a URL?)]\n"
    try:
        return ImagePart.of(raw, what="an image of the conversation", label=media_type)
    except ImageError as e:
        return f"\n[{e}; it was not carried over]\n"
