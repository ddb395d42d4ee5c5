"""Anthropic Messages request bodies, sans-IO: a ``ModelRequest`` in, body bytes out.

Thinking blocks (with their signatures) and redacted thinking must go back unchanged on the
assistant turn that produced them, so a turn with any of them carries its whole block
sequence as ``ReplayState`` (saved by ``anthropic_stream``) and is rebuilt block for block.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Any

from byok.model.images import ImagePart
from byok.model.messages import Message, ReplayState, ToolCall
from byok.model.request import (
    AssistantTurn,
    HistoryItem,
    ModelRequest,
    RenderedPrefix,
    RenderedRequest,
    ToolImagesTurn,
    ToolResultTurn,
    ToolSpec,
    UserTurn,
)
from byok.providers.kinds import ANTHROPIC
from byok.providers.rendering import (
    SLOT,
    assemble,
    cached,
    dumpb_spliced,
    keep_prefix,
    place_tools,
    render_start,
    schema,
    vision_key,
    with_images_note,
)
from byok.providers.replay import saved_list

# The API requires max_tokens. 8192 fits every current model's output limit; configure
# max_output_tokens (or extra_body, e.g. together with a thinking budget) for more.
DEFAULT_MAX_TOKENS = 8192


def build_request(req: ModelRequest) -> bytes:
    return render_request(req).body


def render_request(req: ModelRequest) -> RenderedRequest:
    """The request body and its ``system`` + ``messages`` elements. Key order is fixed by
    construction.

    Roles must alternate, so consecutive same-role items become one message: tool results
    that follow an assistant turn form one user message, and a user turn right after them
    is appended to it as a text block. Such a merge rewrites the last message, so the
    ``messages`` prefix property holds whenever the earlier history ends in a complete
    message, as it does in a tool loop (its next item is always the assistant's turn).
    Each merged group's message text is cached, keyed by the group's items.
    """
    s = req.settings
    _key, messages = prefix_texts(req)
    body: dict[str, Any] = {
        "model": s.upstream_model,
        "max_tokens": s.max_output_tokens if s.max_output_tokens is not None else DEFAULT_MAX_TOKENS,
        "stream": True,
    }
    if s.prompt_cache:
        # One breakpoint the API moves to the last cacheable block itself: the body's messages
        # stay byte for byte what they were, and each turn reads the previous one's cache.
        body["cache_control"] = {"type": "ephemeral"}
    if req.system:
        body["system"] = req.system
    body["messages"] = SLOT
    tools = place_tools(body, _eager_tool if s.eager_input_streaming else _tool, req.tools)
    return assemble(body, "messages", messages, s.extra_body, tools)


def prefix_key(req: ModelRequest) -> Hashable:
    """The ``messages`` element texts depend on the history and on whether the model sees images
    (the system prompt and the cache settings sit outside them)."""
    return vision_key(ANTHROPIC, req.settings.vision)


def prefix_texts(req: ModelRequest) -> tuple[Hashable, list[bytes]]:
    """The ``messages`` element texts of ``req``'s history (one per merged message) and the key
    they are kept under. A stored render's texts (RenderedPrefix) are used as they are only when
    the history after them starts a message of its own; else its messages are rendered here."""
    key, vision = prefix_key(req), req.settings.vision
    history, done, messages, size = render_start(key, req.history, _starts_a_message)
    last: tuple[int, int, int] | None = None  # where the last message starts: its first item,
    # the messages and bytes before it
    for start, group in _groups(history, done):
        last = (start, len(messages), size)
        (text,) = cached(vision_key((ANTHROPIC, group), vision), _render, group, vision)
        messages.append(text)
        size += len(text)
    if last is not None:
        # A later item may still join the last message, so what is final ends where it starts;
        # that a message starts there is known only while the item there is the same one.
        start, count, kept_size = last
        keep_prefix(key, history[: start + 1], start, messages[:count], kept_size)
    return key, messages


def _starts_a_message(prefix: RenderedPrefix, history: tuple[HistoryItem, ...]) -> bool:
    """Whether the items after ``prefix`` (``history[0]``) begin a message of their own: the
    first that gives one has the other role than the prefix's last. A stored render holds whole
    messages, and a merge would rewrite its last."""
    last = _last_role(prefix.messages)
    if last is None:
        return False
    for _start, group in _groups(history, 1):
        return _role(group[0]) != last
    return True


def _last_role(messages: tuple[Message, ...]) -> str | None:
    """The role of the message the last of ``messages`` renders into; None when that takes more
    than one message to tell (an assistant turn that may give no blocks)."""
    for m in reversed(messages):
        if m.role == "system":
            continue
        if m.role == "assistant":
            return "assistant" if m.text or m.tool_calls else None
        return "user"
    return None


def _role(item: HistoryItem) -> str:
    return "assistant" if isinstance(item, AssistantTurn) else "user"


def _tool(t: ToolSpec) -> dict[str, Any]:
    return {"name": t.name, "description": t.description, "input_schema": schema(t.parameters_json)}


def _eager_tool(t: ToolSpec) -> dict[str, Any]:
    # The input streams as the model writes it, unvalidated: the complete arguments are still
    # checked when the call ends (a cut one becomes the tool's error).
    return {**_tool(t), "eager_input_streaming": True}


def _groups(history: tuple[HistoryItem, ...], start: int = 0) -> list[tuple[int, tuple[HistoryItem, ...]]]:
    """The history from ``start`` (where a message starts) cut into the items of each message,
    with the index of its first item: runs of the same role. An assistant turn with no blocks
    belongs to no message (the API rejects an empty one), so the roles around it merge."""
    groups: list[tuple[int, tuple[HistoryItem, ...]]] = []
    run: list[HistoryItem] = []
    first = start
    role = ""
    for i in range(start, len(history)):
        item = history[i]
        if isinstance(item, ToolImagesTurn):
            continue  # the images are in their tool_result blocks
        if isinstance(item, AssistantTurn):
            # Text or calls always give blocks; only a bare turn needs its replay looked at.
            if not item.text and not item.tool_calls and not _assistant_blocks(item):
                continue
            item_role = "assistant"
        else:
            item_role = "user"
        if item_role != role and run:
            groups.append((first, tuple(run)))
            run = []
        if not run:
            first = i
        role = item_role
        run.append(item)
    if run:
        groups.append((first, tuple(run)))
    return groups


def _render(group: tuple[HistoryItem, ...], vision: bool = True) -> tuple[bytes]:
    return (dumpb_spliced(lambda text: _message(group, text, vision)),)


def _message(
    group: tuple[HistoryItem, ...], text: Callable[[str], str], vision: bool = True
) -> dict[str, Any]:
    """The one message of ``group`` (one role), its texts passed through ``text`` (dumpb_spliced)."""
    messages: list[dict[str, Any]] = []
    for item in group:
        if isinstance(item, UserTurn):
            _append(messages, "user", _user_blocks(item, text, vision))
        elif isinstance(item, ToolResultTurn):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": item.call_id,
                "content": _result_content(item, text, vision),
            }
            if item.is_error:
                block["is_error"] = True
            _append(messages, "user", [block])
        elif isinstance(item, AssistantTurn):
            _append(messages, "assistant", _assistant_blocks(item))
        else:  # pragma: no cover - HistoryItem is closed
            raise TypeError(f"unknown history item {item!r}")
    (message,) = messages  # one role, so one message
    return message


def _user_blocks(item: UserTurn, text: Callable[[str], str], vision: bool) -> list[dict[str, Any]]:
    if not item.images:
        return [{"type": "text", "text": text(item.text)}]
    if not vision:
        return [{"type": "text", "text": text(with_images_note(item.text, len(item.images)))}]
    # The images first, then the text that refers to them (as Anthropic advises).
    return [*map(_image, item.images), {"type": "text", "text": text(item.text)}]


def _result_content(item: ToolResultTurn, text: Callable[[str], str], vision: bool) -> Any:
    if not item.images:
        return text(item.content)
    if not vision:
        return text(with_images_note(item.content, len(item.images)))
    return [{"type": "text", "text": text(item.content)}, *map(_image, item.images)]


def _image(part: ImagePart) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": part.media_type, "data": part.base64()},
    }


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    if messages and messages[-1]["role"] == role:
        last = messages[-1]
        if isinstance(last["content"], str):
            last["content"] = [{"type": "text", "text": last["content"]}]
        last["content"].extend(blocks)
    elif role == "user" and len(blocks) == 1 and blocks[0]["type"] == "text":
        messages.append({"role": role, "content": blocks[0]["text"]})  # the plain form of one text
    else:
        messages.append({"role": role, "content": list(blocks)})


def _assistant_blocks(turn: AssistantTurn) -> list[dict[str, Any]]:
    saved = _saved_blocks(turn.replay)
    if saved is None:
        # No state of ours (plain turn, or one produced by another adapter): text and calls.
        blocks = [{"type": "text", "text": turn.text}] if turn.text else []
        return blocks + [_tool_use(c) for c in turn.tool_calls]
    calls = {c.call_id: c for c in turn.tool_calls}
    texts_match = "".join(b.get("text", "") for b in saved if b.get("type") == "text") == turn.text
    out: list[dict[str, Any]] = []
    for block in saved:
        kind = block.get("type")
        if kind == "thinking":
            out.append(
                {
                    "type": "thinking",
                    "thinking": block.get("thinking", ""),
                    "signature": block.get("signature", ""),
                }
            )
        elif kind == "redacted_thinking":
            out.append({"type": "redacted_thinking", "data": block.get("data", "")})
        elif kind == "text":
            # The API rejects empty text blocks, so one the stream opened but never filled goes.
            if texts_match and block.get("text"):
                out.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use":
            # Projection leaves out calls that never got a result; so does the replay.
            call = calls.pop(block.get("id", ""), None)
            if call is not None:
                out.append(_tool_use(call))
        elif isinstance(block.get("block"), dict):
            out.append(block["block"])  # a block type we do not model, sent back verbatim
    if not texts_match and turn.text:
        first_call = next((i for i, b in enumerate(out) if b["type"] == "tool_use"), len(out))
        out.insert(first_call, {"type": "text", "text": turn.text})
    out.extend(_tool_use(c) for c in turn.tool_calls if c.call_id in calls)
    return out


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.call_id, "name": call.name, "input": _tool_input(call.arguments)}


def _tool_input(arguments: str) -> dict[str, Any]:
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    # Only another provider's malformed call gets here (our parser rejects them); keep its
    # text visible to the model rather than failing every later request of the conversation.
    return value if isinstance(value, dict) else {"_invalid_arguments": arguments}


def _saved_blocks(replay: ReplayState | None) -> list[dict[str, Any]] | None:
    return saved_list(replay, ANTHROPIC, "blocks")
