"""Request bodies assembled from cached element texts, and the same elements found in any body.

Every adapter renders its history as an ordered list of JSON texts, one per element of the
array the prefix meter compares (Chat ``messages``; Responses ``input``; Anthropic ``messages``,
one per merged message). Each history item's (or merged group's) texts are cached, so a long
conversation serialises only what is new; the body is the rest of the request serialised
around a placeholder that the joined texts replace. ``json.dumps`` output composes (an array's
text is ``[`` + its elements' texts joined by ``,`` + ``]``), so the bytes are exactly those
of dumping the whole body at once.

``split_body`` finds the same elements in a body it did not render (a stored request after a
restart, or a body whose message array ``extra_body`` replaced): each element's exact span,
walked with ``JSONDecoder.raw_decode``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Hashable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from byok.model.body import SplicedBody
from byok.model.messages import SPLICE_MIN, json_string
from byok.model.projection import expanded
from byok.model.request import HistoryItem, RenderedPrefix, RenderedRequest, ToolSpec
from byok.providers.render_cache import (  # noqa: F401 - re-exported: the adapters' and tests' names
    FRAGMENTS,
    cached,
    forget_rendered,
    keep_prefix,
    rendered_prefix,
)

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# The C encoder JSONEncoder.encode builds on every call, built once (~1.5 us of each item's ~5 us
# cold render). Without circular checks it holds no state, so sharing it is safe; the values
# rendered come from frozen request values and cannot be circular.
_C_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, True)
)


def dumps(obj: Any) -> str:
    """``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)``."""
    if _C_ENCODER is None or isinstance(obj, str):
        return _ENCODER.encode(obj)  # pragma: no cover - CPython has the C encoder
    return "".join(_C_ENCODER(obj, 0))


# A text this long (a Read result, a pasted file) goes through dumps as a hole and is escaped by
# json_string, at memchr speed, instead of by json's escaper at ~2 ns a character (4.6 against
# 1.3 ms for a 2.35 MB Read result).
LARGE_MIN = SPLICE_MIN


def _hole(k: int) -> str:
    return f"\ue000byok-large:{k}\ue001"


def _as_is(value: str) -> str:
    return value


def dumpb_spliced(build: Callable[[Callable[[str], str]], Any]) -> bytes:
    """``dumpb(build(lambda text: text))``. ``build`` makes the object, passing each text that
    may be large through the function it is given: a large one is serialised as a hole and its
    JSON (json_string) spliced in. When a hole's JSON is not found exactly once (another value
    of the object is a hole's text), the object is built again with its texts as they are."""
    texts: list[str] = []

    def text(value: str) -> str:
        if len(value) < LARGE_MIN:
            return value
        texts.append(value)
        return _hole(len(texts) - 1)

    out = dumps(build(text))
    if not texts:
        return out.encode()
    spans: list[tuple[int, int, str]] = []
    for k, value in enumerate(texts):
        hole = dumps(_hole(k))
        at = out.find(hole)
        if at < 0 or out.find(hole, at + 1) >= 0:
            return dumpb(build(_as_is))
        spans.append((at, at + len(hole), value))
    parts: list[bytes] = []
    done = 0
    for start, end, value in sorted(spans):
        parts += (out[done:start].encode(), json_string(value))
        done = end
    parts.append(out[done:].encode())
    return b"".join(parts)


# Part of every cache and prefix key of a render for a model configured without vision: the
# texts of items with images differ (a note instead of the image), the rest do not.
TEXT_ONLY = "text-only"


def vision_key(key: Hashable, vision: bool) -> Hashable:
    """``key`` for a render with images, a key of its own for a text-only one."""
    return key if vision else (key, TEXT_ONLY)


def images_note(count: int) -> str:
    """What a model configured without vision sees where images were (never a silent drop)."""
    what = "an image" if count == 1 else f"{count} images"
    return f"[{what} left out here: this model is configured without vision (vision = false)]"


def with_images_note(text: str, count: int) -> str:
    return f"{images_note(count)}\n\n{text}" if text else images_note(count)


@functools.lru_cache(maxsize=256)
def schema(parameters_json: str) -> Any:
    """A tool's parameters JSON Schema, parsed once per text (every request carries every tool).
    Shared between requests: only ever serialised, never changed."""
    return json.loads(parameters_json)


def dumpb(obj: Any) -> bytes:
    return dumps(obj).encode()


@functools.lru_cache(maxsize=64)
def tools_json(shape: Callable[[ToolSpec], Any], tools: tuple[ToolSpec, ...]) -> str:
    """The JSON text of a request's tools array, each tool as ``shape`` (an adapter's module
    function) gives it: every request of a mode carries the same tools, ~10 KB of schemas that
    took most of a short conversation's render to encode again."""
    return dumps([shape(t) for t in tools])


def render_start(
    key: Hashable,
    history: tuple[HistoryItem, ...],
    fits: Callable[[RenderedPrefix, tuple[HistoryItem, ...]], bool] = lambda _prefix, _history: True,
) -> tuple[tuple[HistoryItem, ...], int, list[bytes], int]:
    """``(history, done, texts, size)``: where a render of ``history`` under ``key`` starts. The
    first ``done`` items render to ``texts`` (``size`` bytes): what the last render under ``key``
    kept, or a leading stored render of this key as it is (when it ``fits`` what follows it). A
    stored render of another key, or one that does not fit, is expanded into its items."""
    done, texts, size = rendered_prefix(key, history)
    first = history[0] if history else None
    if not done and isinstance(first, RenderedPrefix):
        if first.key == key and fits(first, history):
            return history, 1, list(first.texts), first.size
        history = expanded(history)
    return history, done, texts, size


def item_texts(
    prefix_key: Hashable,
    history: tuple[HistoryItem, ...],
    texts_of: Callable[[Any], tuple[bytes, ...]],
    head: Callable[[], tuple[bytes, ...]] | None = None,
) -> list[bytes]:
    """The element texts of an adapter that renders each history item on its own: ``head()``'s
    (elements before the history's), then ``texts_of(item)`` for each item, starting from what
    the last render under ``prefix_key`` kept (all of it is final)."""
    history, done, texts, size = render_start(prefix_key, history)
    if not done and head is not None:
        first = head()
        texts += first
        size += sum(map(len, first))
    for item in history[done:]:
        out = texts_of(item)
        texts += out
        size += sum(map(len, out))
    keep_prefix(prefix_key, history, len(history), texts, size)
    return texts


def place_tools(
    body: dict[str, Any], shape: Callable[[ToolSpec], Any], tools: tuple[ToolSpec, ...]
) -> str | None:
    """Mark where ``body``'s tools array goes (at this point of its key order) and return its
    cached text for ``assemble``; None when there are no tools."""
    if not tools:
        return None
    body["tools"] = TOOLS_SLOT
    return tools_json(shape, tools)


# Placeholders no real value can equal, where the element texts and the tools array's cached
# text go.
SLOT = "\u0000byok-messages-slot\u0000"
_SLOT_JSON = dumps(SLOT)
TOOLS_SLOT = "\u0000byok-tools-slot\u0000"
_TOOLS_SLOT_JSON = dumps(TOOLS_SLOT)
# Keys the meter reads (see split_body); extra_body touching one of them takes the slow path.
_METER_KEYS = frozenset({"messages", "input", "system", "instructions"})


def assemble(
    body: dict[str, Any],
    array_key: str,
    array: list[bytes],
    extra_body: tuple[tuple[str, Any], ...],
    tools: str | None = None,
) -> RenderedRequest:
    """``body`` (with ``SLOT`` as its ``array_key`` value) with ``extra_body`` set over it, last,
    so per-model configuration can add (or deliberately override) anything; then ``array``
    spliced in, and ``tools`` (``tools_json``) where its ``"tools"`` is ``TOOLS_SLOT``."""
    for key, value in extra_body:
        body[key] = value
    text = dumps(body)
    if tools is not None and body.get("tools") is TOOLS_SLOT:
        text = text.replace(_TOOLS_SLOT_JSON, tools, 1)
    at = text.find(_SLOT_JSON) if body.get(array_key) is SLOT else -1
    if at < 0 or _METER_KEYS.intersection(key for key, _ in extra_body):
        # extra_body replaced or added what the meter reads: find the elements in the bytes.
        data = text.encode()
        if at >= 0:
            data = text[:at].encode() + b"[" + b",".join(array) + b"]" + text[at + len(_SLOT_JSON) :].encode()
        split = split_body(data)
        return split if split is not None else RenderedRequest(data, _model(body))
    prefix, suffix = (text[:at] + "[").encode(), ("]" + text[at + len(_SLOT_JSON) :]).encode()
    # Not joined: the 5.7 MB of a 5,000-message history are the cached texts themselves, sent
    # and hashed piece by piece (model/body.py).
    items = tuple(array)
    data = SplicedBody(prefix, items, suffix)
    start, end = len(prefix) - 1, len(data) - len(suffix) + 1
    head_key = "instructions" if array_key == "input" else "system"
    if head_key in body:
        head = cached(("head", body[head_key]), _one, body[head_key])
        return RenderedRequest(data, _model(body), head + items, 1, (start, end))
    return RenderedRequest(data, _model(body), items, 0, (start, end))


def _one(obj: Any) -> tuple[bytes]:
    return (dumpb(obj),)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model", "")
    # As the old parse of the body read it back (a tuple is a JSON list).
    return model if isinstance(model, str) else str(json.loads(dumps(model)))


# --- elements of a body we did not render -----------------------------------------------------

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def split_body(body: bytes) -> RenderedRequest | None:
    """The meter's elements of any JSON request body, as ``json.loads`` would see them: the
    ``input`` array (Responses) with ``instructions`` before it, else the ``messages`` array
    with ``system`` before it (Anthropic; Chat keeps its system message inside). Each element is
    its exact text in ``body``. None when ``body`` is not a JSON object; no elements when it
    has no such array."""
    try:
        text = body.decode()
        return _split(body, text)
    except (ValueError, IndexError):  # JSONDecodeError is a ValueError
        return None


def _split(body: bytes, text: str) -> RenderedRequest | None:
    ws = _WS.match
    i = ws(text, 0).end()
    if text[i] != "{":
        return None
    values: dict[str, tuple[int, int]] = {}  # key -> span of its value; the last one wins
    arrays: dict[str, list[tuple[int, int]]] = {}  # key -> spans of its elements
    i = ws(text, i + 1).end()
    if text[i] == "}":
        i += 1
    else:
        while True:
            key, i = _DECODER.raw_decode(text, i)
            if not isinstance(key, str):
                raise ValueError("object key is not a string")
            i = ws(text, i).end()
            if text[i] != ":":
                raise ValueError("expected ':'")
            start = i = ws(text, i + 1).end()
            arrays.pop(key, None)
            if text[i] == "[" and key in ("messages", "input"):
                spans, i = _array(text, i)
                arrays[key] = spans
            else:
                _, i = _DECODER.raw_decode(text, i)
            values[key] = (start, i)
            i = ws(text, i).end()
            if text[i] == ",":
                i = ws(text, i + 1).end()
                continue
            if text[i] != "}":
                raise ValueError("expected ',' or '}'")
            i += 1
            break
    if ws(text, i).end() != len(text):
        raise ValueError("extra data")
    model = "" if "model" not in values else str(json.loads(text[slice(*values["model"])]))
    if "input" in arrays:
        array_key, head_key = "input", "instructions"
    elif "messages" in arrays:
        array_key, head_key = "messages", "system"
    else:
        return RenderedRequest(body, model)
    spans = ([values[head_key]] if head_key in values else []) + arrays[array_key]
    start, end = values[array_key]
    if text.isascii():  # str offsets are byte offsets
        elements = tuple(body[a:b] for a, b in spans)
    else:
        elements = tuple(text[a:b].encode() for a, b in spans)
        start, end = len(text[:start].encode()), len(text[:end].encode())
    return RenderedRequest(body, model, elements, int(head_key in values), (start, end))


def _array(text: str, i: int) -> tuple[list[tuple[int, int]], int]:
    """Spans of the elements of the array starting at ``text[i]``, and the index after it."""
    ws = _WS.match
    spans: list[tuple[int, int]] = []
    i = ws(text, i + 1).end()
    if text[i] == "]":
        return spans, i + 1
    while True:
        _, end = _DECODER.raw_decode(text, i)
        spans.append((i, end))
        i = ws(text, end).end()
        if text[i] == "]":
            return spans, i + 1
        if text[i] != ",":
            raise ValueError("expected ',' or ']'")
        i = ws(text, i + 1).end()
