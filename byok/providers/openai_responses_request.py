"""OpenAI Responses request bodies, sans-IO: a ``ModelRequest`` in, body bytes out.

Stateless by design: ``store: false`` and never ``previous_response_id``. Every request carries
the whole history, with each earlier assistant turn sent back as the output items the API
produced (reasoning with its encrypted content, messages, function calls) in their original
order, reconstructed from the turn's ``ReplayState`` (saved by ``openai_responses_stream``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from byok.model.images import ImagePart
from byok.model.messages import ReplayState, ToolCall
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
from byok.providers.kinds import OPENAI_RESPONSES
from byok.providers.rendering import (
    SLOT,
    assemble,
    cached,
    dumpb,
    dumpb_spliced,
    item_texts,
    place_tools,
    schema,
    vision_key,
    with_images_note,
)
from byok.providers.replay import saved_list


def prefix_key(req: ModelRequest) -> Hashable:
    """The ``input`` element texts depend on the history, and on whether the model sees images."""
    return vision_key(OPENAI_RESPONSES, req.settings.vision)


def prefix_texts(req: ModelRequest) -> tuple[Hashable, list[bytes]]:
    """The ``input`` element texts of ``req``'s history and the key they are kept under (see
    openai_chat_request.prefix_texts)."""
    key, vision = prefix_key(req), req.settings.vision
    return key, item_texts(
        key,
        req.history,
        lambda item: cached(vision_key((OPENAI_RESPONSES, item), vision), _render, item, vision),
    )


def build_request(req: ModelRequest) -> bytes:
    return render_request(req).body


def render_request(req: ModelRequest) -> RenderedRequest:
    """The request body and its ``instructions`` + ``input`` elements. Key order is fixed by
    construction and each history item serializes on its own (cached), so a longer history
    only appends to ``input``."""
    s = req.settings
    _key, items = prefix_texts(req)
    body: dict[str, Any] = {
        "model": s.upstream_model,
        "stream": True,
        "store": False,
        # Without stored responses, encrypted reasoning is the only way to carry it forward.
        "include": ["reasoning.encrypted_content"],
    }
    if s.cache_key:
        body["prompt_cache_key"] = s.cache_key
    if req.system:
        body["instructions"] = req.system
    body["input"] = SLOT
    tools = place_tools(body, _tool, req.tools)
    if s.max_output_tokens is not None:
        body["max_output_tokens"] = s.max_output_tokens
    return assemble(body, "input", items, s.extra_body, tools)


def _tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "name": t.name,
        "description": t.description,
        "parameters": schema(t.parameters_json),
        # This API defaults to strict schemas, which reject optional properties.
        "strict": False,
    }


def _render(item: HistoryItem, vision: bool = True) -> list[bytes]:
    """The ``input`` items of one history item (an assistant turn may give several, or none)."""
    if isinstance(item, UserTurn):
        return [dumpb_spliced(lambda text: _user(item, text, vision))]
    if isinstance(item, AssistantTurn):
        return [dumpb(i) for i in _assistant_items(item)]
    if isinstance(item, ToolResultTurn):
        # No is_error flag in this API; the output text itself says what went wrong.
        return [dumpb_spliced(lambda text: _output(item, text, vision))]
    if isinstance(item, ToolImagesTurn):
        return []  # the images went with their function_call_output
    raise TypeError(f"unknown history item {item!r}")  # pragma: no cover - HistoryItem is closed


def _user(item: UserTurn, text: Callable[[str], str], vision: bool) -> dict[str, Any]:
    if not item.images:
        return {"role": "user", "content": text(item.text)}
    if not vision:
        return {"role": "user", "content": text(with_images_note(item.text, len(item.images)))}
    # The images first, then the text that refers to them.
    return {
        "role": "user",
        "content": [*map(_image, item.images), {"type": "input_text", "text": text(item.text)}],
    }


def _output(item: ToolResultTurn, text: Callable[[str], str], vision: bool) -> dict[str, Any]:
    output: Any
    if not item.images:
        output = text(item.content)
    elif vision:
        output = [{"type": "input_text", "text": text(item.content)}, *map(_image, item.images)]
    else:
        output = text(with_images_note(item.content, len(item.images)))
    return {"type": "function_call_output", "call_id": item.call_id, "output": output}


def _image(part: ImagePart) -> dict[str, Any]:
    return {"type": "input_image", "image_url": part.data_url(), "detail": "auto"}


def _assistant_items(turn: AssistantTurn) -> list[dict[str, Any]]:
    saved = _saved_items(turn.replay)
    if saved is None:
        # No state of ours (plain turn, or one produced by another adapter): text and calls.
        out: list[dict[str, Any]] = []
        if turn.text:
            out.append({"role": "assistant", "content": turn.text})
        out.extend(_call_item(None, c) for c in turn.tool_calls)
        return out
    return _replayed_items(turn, saved)


def _replayed_items(turn: AssistantTurn, saved: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved output items in order. Calls come from the turn (projection leaves out calls
    that never got a result, and the API rejects a call without its output); the saved
    message texts are used only while they still add up to the turn's text."""
    calls = {c.call_id: c for c in turn.tool_calls}
    texts_match = "".join(i.get("text", "") for i in saved if i.get("type") == "message") == turn.text
    text_placed = texts_match or not turn.text
    entries: list[dict[str, Any] | None] = []  # None: a saved item left out
    for item in saved:
        kind = item.get("type")
        if kind == "reasoning":
            entries.append(_reasoning_item(item))
        elif kind == "message":
            if texts_match:
                entries.append(_message_item(item))
            elif not text_placed:
                entries.append({"role": "assistant", "content": turn.text})
                text_placed = True
            else:
                entries.append(None)
        elif kind == "function_call":
            call = calls.pop(item.get("call_id", ""), None)
            entries.append(None if call is None else _call_item(item.get("id"), call))
        else:
            entries.append(item.get("item"))  # an item type we do not model, sent back verbatim
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        if saved[i].get("type") == "reasoning" and _follower_dropped(saved, entries, i):
            # The API rejects a reasoning item without the item that followed it.
            continue
        out.append(entry)
    if not text_placed:
        first_call = next((i for i, e in enumerate(out) if e.get("type") == "function_call"), len(out))
        out.insert(first_call, {"role": "assistant", "content": turn.text})
    out.extend(_call_item(None, c) for c in turn.tool_calls if c.call_id in calls)
    return out


def _follower_dropped(saved: list[dict[str, Any]], entries: list[dict[str, Any] | None], i: int) -> bool:
    for j in range(i + 1, len(saved)):
        if saved[j].get("type") != "reasoning":
            return entries[j] is None
    return False


def _reasoning_item(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "reasoning", "id": item.get("id", ""), "summary": item.get("summary", [])}
    out.update({k: item[k] for k in ("content", "encrypted_content") if item.get(k)})
    return out


def _message_item(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "message",
        "role": "assistant",
        "id": item.get("id", ""),
        "content": [{"type": "output_text", "text": item.get("text", "")}],
    }
    if isinstance(item.get("phase"), str):
        out["phase"] = item["phase"]  # gpt-5.x commentary vs final answer
    return out


def _call_item(item_id: str | None, call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function_call"}
    if item_id:
        out["id"] = item_id
    out.update(call_id=call.call_id, name=call.name, arguments=call.arguments)  # exact original text
    return out


def _saved_items(replay: ReplayState | None) -> list[dict[str, Any]] | None:
    return saved_list(replay, OPENAI_RESPONSES, "items")
