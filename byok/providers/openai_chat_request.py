"""OpenAI Chat Completions request bodies, sans-IO: a ``ModelRequest`` in, body bytes out.

Also serves the many "OpenAI-compatible" providers (DeepSeek, Groq, OpenRouter, xAI...). An
assistant turn goes back as its text and calls, plus, on tool turns where configured, the
reasoning ``openai_chat_stream`` saved as its ``ReplayState``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Any

from byok.model.images import ImagePart
from byok.model.messages import ReplayState
from byok.model.request import (
    AssistantTurn,
    HistoryItem,
    ModelRequest,
    RenderedRequest,
    ToolImagesTurn,
    ToolResultTurn,
    ToolSpec,
    UserTurn,
)
from byok.providers.kinds import OPENAI_CHAT
from byok.providers.rendering import (
    SLOT,
    assemble,
    cached,
    dumpb_spliced,
    images_note,
    item_texts,
    place_tools,
    schema,
    vision_key,
    with_images_note,
)


def build_request(req: ModelRequest) -> bytes:
    return render_request(req).body


def render_request(req: ModelRequest) -> RenderedRequest:
    """The request body and its ``messages`` elements. Key order is fixed by construction
    (never sorted) so identical requests give identical bytes and a longer history only
    appends to ``messages``."""
    s = req.settings
    _key, elements = prefix_texts(req)
    body: dict[str, Any] = {
        "model": s.upstream_model,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if s.cache_key:
        body["prompt_cache_key"] = s.cache_key
    body["messages"] = SLOT
    tools = place_tools(body, _tool, req.tools)
    if s.max_output_tokens is not None:
        body["max_tokens"] = s.max_output_tokens
    return assemble(body, "messages", elements, s.extra_body, tools)


def prefix_key(req: ModelRequest) -> Hashable:
    """What the ``messages`` element texts depend on besides the history: the system message's
    text, whether reasoning is replayed on tool turns and whether the model sees images."""
    s = req.settings
    return vision_key((OPENAI_CHAT, s.replay_reasoning_on_tool_turns, req.system), s.vision)


def prefix_texts(req: ModelRequest) -> tuple[Hashable, list[bytes]]:
    """The ``messages`` element texts of ``req`` (its system message, then its history) and the key
    they are kept under: what a stored render of the history holds (RenderedPrefix)."""
    flag, vision = req.settings.replay_reasoning_on_tool_turns, req.settings.vision
    system = {"role": "system", "content": req.system}
    key = prefix_key(req)
    return key, item_texts(
        key,
        req.history,
        lambda item: cached(vision_key((OPENAI_CHAT, item, flag), vision), _render, item, flag, vision),
        (lambda: cached((OPENAI_CHAT, "system", req.system), _render, system, False)) if req.system else None,
    )


def _tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": schema(t.parameters_json)},
    }


def _render(
    item: HistoryItem | dict[str, Any], replay_on_tool_turns: bool, vision: bool = True
) -> tuple[bytes]:
    return (dumpb_spliced(lambda text: _message(item, replay_on_tool_turns, text, vision)),)


def _message(
    item: HistoryItem | dict[str, Any],
    replay_on_tool_turns: bool,
    text: Callable[[str], str] = str,
    vision: bool = True,
) -> dict[str, Any]:
    """The Chat message of ``item``, its texts passed through ``text`` (dumpb_spliced)."""
    if isinstance(item, dict):
        return item  # the system message
    if isinstance(item, UserTurn):
        if not item.images:
            return {"role": "user", "content": text(item.text)}
        if not vision:
            return {"role": "user", "content": text(with_images_note(item.text, len(item.images)))}
        # The images first, then the text that refers to them.
        return {
            "role": "user",
            "content": [*map(_image, item.images), {"type": "text", "text": text(item.text)}],
        }
    if isinstance(item, AssistantTurn):
        return _assistant_message(item, replay_on_tool_turns)
    if isinstance(item, ToolResultTurn):
        # Chat has no is_error flag; the content itself says what went wrong. A tool message
        # holds text only: its images follow the round (ToolImagesTurn).
        return {"role": "tool", "tool_call_id": item.call_id, "content": text(item.content)}
    if isinstance(item, ToolImagesTurn):
        if not vision:
            return {"role": "user", "content": images_note(sum(len(r.images) for r in item.results))}
        parts: list[dict[str, Any]] = []
        for r in item.results:
            parts.append({"type": "text", "text": f"What the {r.name} call {r.call_id} returned:"})
            parts += map(_image, r.images)
        return {"role": "user", "content": parts}
    raise TypeError(f"unknown history item {item!r}")  # pragma: no cover - HistoryItem is closed


def _image(part: ImagePart) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": part.data_url()}}


def _assistant_message(turn: AssistantTurn, replay_on_tool_turns: bool) -> dict[str, Any]:
    # null content is only valid next to tool_calls; a bare empty turn sends "".
    msg: dict[str, Any] = {"role": "assistant", "content": turn.text or (None if turn.tool_calls else "")}
    if turn.tool_calls and replay_on_tool_turns and turn.replay is not None:
        reasoning = _replayed_reasoning(turn.replay)
        if reasoning is not None:
            # DeepSeek thinking mode rejects later requests that drop this (NOTES §1).
            msg["reasoning_content"] = reasoning
    if turn.tool_calls:
        msg["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},  # exact original text
            }
            for c in turn.tool_calls
        ]
    return msg


def _replayed_reasoning(replay: ReplayState) -> str | None:
    if replay.provider_kind != OPENAI_CHAT:
        return None  # another adapter's state (e.g. after a provider switch) is not ours to send
    try:
        obj = json.loads(replay.data)
    except ValueError:
        return None
    value = obj.get("reasoning_content") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None
