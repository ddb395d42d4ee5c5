"""ModelRequest: everything a provider call needs, and nothing that varies between retries.

No request ids, no times, no Cursor mode: the same committed revision and prompt give the
same ModelRequest, and therefore the same request bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import attrs

from byok.model.body import Body, as_bytes
from byok.model.images import ImagePart
from byok.model.messages import Message, ReplayState, ToolCall


@attrs.frozen
class ToolSpec:
    name: str
    description: str
    parameters_json: str  # JSON Schema text, canonical


# History items key the adapters' render cache: their hashes are computed once per object, and
# projection hands out the same objects for the same messages (see projection.project).
@attrs.frozen(cache_hash=True)
class UserTurn:
    text: str
    images: tuple[ImagePart, ...] = ()


@attrs.frozen(cache_hash=True)
class AssistantTurn:
    text: str
    thinking: str = ""
    replay: ReplayState | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # original provider order


@attrs.frozen(cache_hash=True)
class ToolResultTurn:
    call_id: str
    name: str
    content: str
    is_error: bool = False
    images: tuple[ImagePart, ...] = ()  # a Read of an image file


@attrs.frozen(cache_hash=True)
class ToolImagesTurn:
    """The images a tool round's results returned, after the round's last result: where an API
    takes images in a tool result (Responses, Anthropic) it renders nothing, and Chat, whose tool
    messages hold text only, shows them to the model as a user message here."""

    results: tuple[ToolResultTurn, ...]  # the round's results with images, in result order


@attrs.frozen(eq=False)  # one object per stored render read back: compared by identity
class RenderedPrefix:
    """The items of ``messages`` as an adapter rendered them, read back from the store: after a
    restart a long history's first items are neither decoded, projected nor rendered again.
    ``texts``: the element texts the render gave under the adapter's prefix ``key`` (for Chat,
    the system message's first). Only ever the first item of a history; an adapter with another
    key renders ``messages`` itself."""

    key: Hashable
    texts: tuple[bytes, ...] = attrs.field(repr=False)
    messages: tuple[Message, ...] = attrs.field(repr=False)
    size: int  # bytes of texts


HistoryItem = UserTurn | AssistantTurn | ToolResultTurn | ToolImagesTurn | RenderedPrefix


@attrs.frozen
class ModelSettings:
    upstream_model: str
    max_output_tokens: int | None = None
    # Chat only: send reasoning_content back on assistant turns that made tool calls.
    replay_reasoning_on_tool_turns: bool = True
    extra_body: tuple[tuple[str, Any], ...] = attrs.field(default=(), hash=False)  # JSON values
    # Anthropic only: automatic prompt caching (a top-level cache_control; the messages, and
    # so the prefix property, stay as they are).
    prompt_cache: bool = False
    # Anthropic only: eager_input_streaming on every tool (tool input streamed unbuffered).
    eager_input_streaming: bool = False
    # OpenAI kinds: sent as prompt_cache_key when set (one per conversation, so its growing
    # prefix is routed to the machine that cached the previous turn).
    cache_key: str = ""
    # False for a model configured without vision: images already in the history are sent as a
    # line of text saying so (the run refuses new ones before it starts).
    vision: bool = True


@attrs.frozen
class ModelRequest:
    system: str
    tools: tuple[ToolSpec, ...]
    history: tuple[HistoryItem, ...]
    settings: ModelSettings


@attrs.frozen
class RenderedRequest:
    """A provider request body and the prefix meter's view of it, from the same render.

    ``elements`` are the compared elements' JSON bytes exactly as they appear in ``body``:
    ``head`` leading ones that sit beside the message array (Responses ``instructions``,
    Anthropic ``system``), then the array's (Chat ``messages``, which hold the system message;
    Responses ``input``; Anthropic ``messages``). ``array`` is the byte span of that array in
    ``body``. Both are None when the body has no message array. ``source`` is the body as the
    render made it: spliced from its pieces by the adapters (sent and recorded as they are),
    whole when cut from bytes; ``body`` joins it once, for whoever needs one buffer.
    """

    source: Body = attrs.field(repr=False)
    model: str
    elements: tuple[bytes, ...] | None = attrs.field(default=None, repr=False, eq=False)
    head: int = 0
    array: tuple[int, int] | None = None

    @functools.cached_property
    def body(self) -> bytes:
        return as_bytes(self.source)
