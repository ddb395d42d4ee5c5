"""Provider streams for the parser properties: the three parsers, SSE wire encoding, and valid
streams (skeletons) of a model turn written out as each provider streams it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from hypothesis import strategies as st

from byok.providers.anthropic_stream import AnthropicStreamParser
from byok.providers.openai_chat_stream import ChatStreamParser
from byok.providers.openai_responses_stream import ResponsesStreamParser
from tests.fuzz.support import small_ints, split, words

Parser = ChatStreamParser | ResponsesStreamParser | AnthropicStreamParser
PARSERS: dict[str, Callable[[], Parser]] = {
    "openai_chat": ChatStreamParser,
    "openai_responses": ResponsesStreamParser,
    "anthropic": AnthropicStreamParser,
}


def sse_wire(events: list[tuple[str | None, Any]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        body = data if isinstance(data, str) and data.startswith(("[DONE]", "{not")) else json.dumps(data)
        out.append(f"{head}data: {body}\n\n")
    return "".join(out).encode()


# Valid streams: a turn the model might produce, written out as each provider streams it. The
# property perturbs them (drop, duplicate, reorder, insert a noise event, replace or delete a field
# deep inside an event, cut the bytes), so that accepted streams are common and their event
# contract is actually checked, while a perturbed stream also probes the error paths.
class Turn(NamedTuple):
    thinking: tuple[str, ...]
    text: tuple[str, ...]
    calls: tuple[tuple[str, str, tuple[str, ...]], ...]  # (call id, name, argument fragments)
    usage: tuple[int, int, int, int]  # input, output, cached, reasoning (Anthropic: cache writes)
    alt: bool  # provider variant: usage on Chat's finish chunk, a Responses reasoning item, a ping
    tail: bool  # provider variant: no Chat [DONE], a Responses [DONE], an Anthropic non-tool stop


_arg_fragments = st.tuples(
    st.dictionaries(st.sampled_from(["path", "x"]), st.text(max_size=4) | st.integers(0, 9), max_size=2),
    st.lists(st.integers(0, 30), max_size=3),
).map(lambda a: tuple(split(json.dumps(a[0]), a[1])))
turns = st.builds(
    Turn,
    thinking=st.lists(words, max_size=2).map(tuple),
    text=st.lists(words, max_size=3).map(tuple),
    calls=st.lists(
        st.tuples(st.sampled_from(["c1", "c2", "c3"]), st.sampled_from(["Read", "Grep"]), _arg_fragments),
        max_size=2,
        unique_by=lambda c: c[0],
    ).map(tuple),
    usage=st.tuples(small_ints, small_ints, small_ints, small_ints),
    alt=st.booleans(),
    tail=st.booleans(),
)


def _chat_skeleton(t: Turn) -> list[tuple[str | None, Any]]:
    def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: Any = None) -> Any:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return (None, {"id": "chatcmpl-1", "choices": choices, "usage": usage})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": r}) for r in t.thinking]
    out += [chunk({"content": x}) for x in t.text]
    for i, (call_id, name, frags) in enumerate(t.calls):
        first, *rest = frags
        fn = {"name": name, "arguments": first}
        out.append(chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function", "function": fn}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in rest]
    inp, outp, cached, reasoning = t.usage
    usage = {
        "prompt_tokens": inp,
        "completion_tokens": outp,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    finish = "tool_calls" if t.calls else "stop"
    out += [chunk({}, finish, usage)] if t.alt else [chunk({}, finish), chunk(usage=usage)]
    if not t.tail:
        out.append((None, "[DONE]"))
    return out


def _responses_skeleton(t: Turn) -> list[tuple[str | None, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "r1", "status": "in_progress", "usage": None}}
    ]

    def item(index: int, added: dict[str, Any], deltas: list[dict[str, Any]], done: dict[str, Any]) -> None:
        out.append({"type": "response.output_item.added", "output_index": index, "item": added})
        out.extend({"output_index": index, "item_id": added["id"], **d} for d in deltas)
        out.append({"type": "response.output_item.done", "output_index": index, "item": {**added, **done}})

    if t.thinking or t.alt:
        thinking = [
            {"type": "response.reasoning_summary_text.delta", "summary_index": 0, "delta": r}
            for r in t.thinking
        ]
        summary = [{"type": "summary_text", "text": "".join(t.thinking)}]
        part = {"type": "response.reasoning_summary_part.added", "summary_index": 0}
        item(
            len(out),
            {"id": "rs", "type": "reasoning", "summary": []},
            [part, *thinking],
            {"summary": summary, "encrypted_content": "enc"},
        )
    if t.text:
        deltas = [{"type": "response.output_text.delta", "content_index": 0, "delta": x} for x in t.text]
        content = [{"type": "output_text", "annotations": [], "text": "".join(t.text)}]
        item(
            len(out),
            {"id": "msg", "type": "message", "role": "assistant", "content": []},
            deltas,
            {"content": content},
        )
    for call_id, name, frags in t.calls:
        args = "".join(frags)
        deltas = [{"type": "response.function_call_arguments.delta", "delta": f} for f in frags]
        deltas.append({"type": "response.function_call_arguments.done", "arguments": args})
        fc = {
            "id": f"fc_{call_id}",
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        item(len(out), fc, deltas, {"arguments": args})
    inp, outp, cached, reasoning = t.usage
    usage = {
        "input_tokens": inp,
        "output_tokens": outp,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens_details": {"reasoning_tokens": reasoning},
    }
    out.append(
        {"type": "response.completed", "response": {"id": "r1", "status": "completed", "usage": usage}}
    )
    events: list[tuple[str | None, Any]] = [(e["type"], e) for e in out]
    return [*events, (None, "[DONE]")] if t.tail else events


def _anthropic_skeleton(t: Turn) -> list[tuple[str | None, Any]]:
    inp, outp, cached, written = t.usage
    usage = {"input_tokens": inp, "cache_read_input_tokens": cached, "cache_creation_input_tokens": written}
    out: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {"id": "m1", "role": "assistant", "usage": {**usage, "output_tokens": 1}},
        }
    ]

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        index = sum(e["type"] == "content_block_start" for e in out)
        out.append({"type": "content_block_start", "index": index, "content_block": start})
        out.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
        out.append({"type": "content_block_stop", "index": index})

    if t.thinking:
        deltas = [{"type": "thinking_delta", "thinking": r} for r in t.thinking]
        block(
            {"type": "thinking", "thinking": "", "signature": ""},
            [*deltas, {"type": "signature_delta", "signature": "s="}],
        )
    if t.alt:
        out.append({"type": "ping"})
    if t.text:
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": x} for x in t.text])
    for call_id, name, frags in t.calls:
        block(
            {"type": "tool_use", "id": call_id, "name": name, "input": {}},
            [{"type": "input_json_delta", "partial_json": f} for f in frags],
        )
    stop = ("end_turn" if t.calls else "stop_sequence") if t.tail else ("tool_use" if t.calls else "end_turn")
    out.append({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": outp}})
    out.append({"type": "message_stop"})
    return [(e["type"], e) for e in out]


SKELETONS: dict[str, Callable[[Turn], list[tuple[str | None, Any]]]] = {
    "openai_chat": _chat_skeleton,
    "openai_responses": _responses_skeleton,
    "anthropic": _anthropic_skeleton,
}
